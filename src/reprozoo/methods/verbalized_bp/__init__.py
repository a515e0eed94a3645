"""Verbalized Bayesian persuasion: classic BP games solved by a PSRO loop over text strategies."""
