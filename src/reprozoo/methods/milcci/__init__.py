"""MILCCI: label-driven multi-trial decomposition into sparse maps and per-trial traces."""
