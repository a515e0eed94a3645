"""Datasets: offline generators (the default) and remote sources, one registry for all families."""
