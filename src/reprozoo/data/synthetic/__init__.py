"""Synthetic datasets with known ground truth (closed-form densities and scores)."""
