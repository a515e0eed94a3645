"""RO-HNN: reduced-order Hamiltonian neural networks (symplectic autoencoder + latent HNN)."""
