# reprozoo: every registered method at one scale, from data to claim verdicts and a report.
#   snakemake --profile profiles/default                    # everything at the default scale (smoke)
#   snakemake --profile profiles/default results/rex/claims.json --config scale=ci
# Rules are generic and driven by the method registry (src/reprozoo/methods/*/spec.yaml).

configfile: "config/config.yaml"


include: "workflows/common.smk"
include: "workflows/data.smk"
include: "workflows/methods.smk"
include: "workflows/report.smk"


rule all:
    default_target: True
    input:
        rules.report.output,
