# Report: every selected method's claims in one summary table, plus an HTML page with the plots.


rule report:
    input:
        claims=expand(f"{RESULTS}/{{method}}/claims.json", method=PLAN.methods),
        tables=expand(f"{RESULTS}/{{method}}/metrics.parquet", method=PLAN.methods),
        plots=expand(f"{RESULTS}/{{method}}/plots", method=PLAN.methods),
    output:
        md=f"{RESULTS}/summary.md",
        parquet=f"{RESULTS}/summary.parquet",
        html=f"{RESULTS}/report.html",
    log:
        f"{RESULTS}/logs/report.log",
    conda:
        env_file("core")
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    script:
        STAGE
