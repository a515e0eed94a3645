"""CBiT: time-series imputation as conditional temporal inference with history compression."""
