"""A2SG: adaptive and asymmetric surrogate gradients for spiking CNNs, against fixed symmetric surrogates."""
