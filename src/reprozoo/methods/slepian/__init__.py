"""Slepian: geographic location encoders from spherical Slepian functions concentrated in a region."""
