"""One folder per method; see docs/adding-a-method.md."""
