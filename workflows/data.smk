# Data acquisition (remote download with checksum, offline generator, or a user path) and
# preprocessing into results/data/<dataset>/<scale>/ with card.json and preview.png.


rule acquire:
    output:
        manifest=f"{RESULTS}/data/{{dataset}}/{{scale}}/raw/manifest.json",
    params:
        source=lambda w: rz_data.source_for(w.dataset, config["data"]),
        path=lambda w: config["data"].get("paths", {}).get(w.dataset),
        overrides=lambda w: config["data"].get("params", {}).get(w.dataset, {}),
        code=dataset_code,
    log:
        f"{RESULTS}/{{scale}}/logs/data/acquire-{{dataset}}.log",
    benchmark:
        f"{RESULTS}/{{scale}}/benchmarks/data/acquire-{{dataset}}.tsv"
    conda:
        dataset_env
    threads: 1
    resources:
        mem_mb=lambda w, attempt: 4000 * attempt,
        runtime=lambda w, attempt: 30 * attempt,
        attempt=lambda w, attempt: attempt,
    script:
        STAGE


rule preprocess:
    input:
        manifest=rules.acquire.output.manifest,
    output:
        card=f"{RESULTS}/data/{{dataset}}/{{scale}}/card.json",
        preview=f"{RESULTS}/data/{{dataset}}/{{scale}}/preview.png",
    params:
        overrides=lambda w: config["data"].get("params", {}).get(w.dataset, {}),
        code=dataset_code,
    log:
        f"{RESULTS}/{{scale}}/logs/data/preprocess-{{dataset}}.log",
    benchmark:
        f"{RESULTS}/{{scale}}/benchmarks/data/preprocess-{{dataset}}.tsv"
    conda:
        dataset_env
    threads: 1
    resources:
        mem_mb=lambda w, attempt: 4000 * attempt,
        runtime=lambda w, attempt: 30 * attempt,
        attempt=lambda w, attempt: attempt,
    script:
        STAGE


rule datasets:
    # every dataset that can be built with the configured sources, at the configured scale:
    #   snakemake datasets --config scale=ci
    input:
        [
            f"{RESULTS}/data/{d}/{SCALE}/card.json"
            for d in rz_data.names()
            if rz_data.buildable(d, config["data"])
        ],
