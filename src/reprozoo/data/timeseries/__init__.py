"""Time-series datasets: real series shipped inside statsmodels, a Lorenz-96 simulator (offline)
and the ETT electricity-transformer CSVs (remote). Processed tables are parquet files with a
``timestamp`` (or ``t``/``step``) column plus one column per variable; the card records frequencies.
"""
