"""reprozoo: reproduce ML papers as one Snakemake platform, every run tracked in MLflow."""
__version__ = "0.1.0"
