# Report: every selected method's claims in one summary table, plus an HTML page with the plots.
# A complete run writes results/<scale>/summary.*; a subset run writes under partial/<tag>/.


rule report:
    input:
        claims=[f"{selection_dir(m)}claims.json" for m in PLAN.methods],
        tables=[f"{selection_dir(m)}metrics.parquet" for m in PLAN.methods],
        plots=[f"{selection_dir(m)}plots" for m in PLAN.methods],
    output:
        md=f"{REPORT_DIR}summary.md",
        parquet=f"{REPORT_DIR}summary.parquet",
        html=f"{REPORT_DIR}report.html",
    params:
        scale=SCALE,
        complete=PLAN.is_complete,
        tracking_uri=TRACKING.get("uri"),
    log:
        f"{REPORT_DIR}logs/report.log",
    benchmark:
        f"{REPORT_DIR}benchmarks/report.tsv"
    conda:
        env_file("core")
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
        attempt=lambda w, attempt: attempt,
    script:
        STAGE
