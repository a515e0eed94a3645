# Report: every selected method's claims in one summary table, plus an HTML page with the plots.
# A complete run writes results/<scale>/summary.*; a subset run writes under partial/<tag>/.
#
# Snakemake's own report (`snakemake --report report.zip`, or `--report report.html`) shows the same
# answers: the outputs marked with report() below and in methods.smk (each method's figures), by
# wave (category) and method (subcategory); captions in workflows/report/.


# Snakemake's report shows HTML and images, not JSON: each method's claims and the verdict table
# as HTML pages, written from the claims.json files in one job (the rule above them stays as it is).
rule report_pages:
    input:
        claims=[f"{selection_dir(m)}claims.json" for m in PLAN.methods],
    output:
        summary=report(
            f"{REPORT_DIR}summary.html",
            caption="report/summary.rst",
            category="Summary",
            labels={"page": "the verdict of every claim"},
        ),
        pages=[
            report(
                f"{selection_dir(m)}claims.html",
                caption="report/claims.rst",
                category=rz_registry.get(m).wave,
                subcategory=m,
                labels={"method": m, "figure": "claims"},
            )
            for m in PLAN.methods
        ],
    log:
        f"{REPORT_DIR}logs/report_pages.log",
    conda:
        env_file("core")
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    script:
        "report/pages.py"


rule report:
    input:
        claims=[f"{selection_dir(m)}claims.json" for m in PLAN.methods],
        tables=[f"{selection_dir(m)}metrics.parquet" for m in PLAN.methods],
        plots=[f"{selection_dir(m)}plots" for m in PLAN.methods],
        pages=rules.report_pages.output.summary,  # the default target builds Snakemake's report pages too
    output:
        md=f"{REPORT_DIR}summary.md",
        parquet=f"{REPORT_DIR}summary.parquet",
        html=f"{REPORT_DIR}report.html",  # not in Snakemake's report: it holds every figure again
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
