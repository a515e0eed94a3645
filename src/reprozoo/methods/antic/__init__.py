"""ANTIC: adaptive neural temporal in-situ compression of a running Kolmogorov-flow simulation."""
