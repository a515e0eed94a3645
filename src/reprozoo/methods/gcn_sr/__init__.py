"""GCN-SR: graph-based symbolic regression on Symbolic Perfect Binary Trees with similarity-weighted policy gradient."""
