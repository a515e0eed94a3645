"""Rex: reversible exponential (stochastic) Runge-Kutta solvers for diffusion models."""
