"""LDR: off-policy log-dispersion regularisation of maximum-likelihood Boltzmann generators."""
