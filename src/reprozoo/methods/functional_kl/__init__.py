"""Functional KL: path-space KL divergence estimation for evaluating trajectory inference."""
