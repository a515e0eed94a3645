"""TTFS SNN training framework: single-spike networks with init, normalisation, temporal decoder, avg pooling."""
