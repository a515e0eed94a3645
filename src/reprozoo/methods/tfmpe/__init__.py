"""TFMPE: likelihood-factorised tokenised flow matching for hierarchical simulation-based inference."""
