"""Building blocks reused by several methods (ODE solvers, networks, atomistic layers)."""
