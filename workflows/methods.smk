# Method stages, generic over the registry: train_shared (optional) -> train (variant x seed)
# -> evaluate -> verify. Resources come from each method's spec for the configured scale and grow
# with the attempt number, so a job killed for memory is retried with more.


rule train_shared:
    input:
        cards=data_cards,
    output:
        done=f"{RESULTS}/{{method}}/_shared/seed{{seed}}/done.json",
    params:
        hp=hp,
        scale=SCALE,
        data=lambda w: data_dirs(w.method),
        tracking=config["tracking"],
    log:
        f"{RESULTS}/logs/{{method}}/train_shared-seed{{seed}}.log",
    conda:
        method_env
    threads: lambda w: method_res(w, "threads")
    resources:
        mem_mb=lambda w, attempt: method_res(w, "mem_mb") * attempt,
        runtime=lambda w, attempt: method_res(w, "runtime") * attempt,
        gpu=lambda w: method_res(w, "gpu"),
        attempt=lambda w, attempt: attempt,
    script:
        STAGE


rule train:
    input:
        cards=data_cards,
        shared=shared_input,
    output:
        metrics=f"{RESULTS}/{{method}}/{{variant}}/seed{{seed}}/metrics.json",
    params:
        hp=hp,
        scale=SCALE,
        data=lambda w: data_dirs(w.method),
        shared_dir=shared_dir,
        tracking=config["tracking"],
    log:
        f"{RESULTS}/logs/{{method}}/train-{{variant}}-seed{{seed}}.log",
    conda:
        method_env
    threads: lambda w: method_res(w, "threads")
    resources:
        mem_mb=lambda w, attempt: method_res(w, "mem_mb") * attempt,
        runtime=lambda w, attempt: method_res(w, "runtime") * attempt,
        gpu=lambda w: method_res(w, "gpu"),
        attempt=lambda w, attempt: attempt,
    script:
        STAGE


rule evaluate:
    input:
        metrics=train_outputs,
    output:
        table=f"{RESULTS}/{{method}}/metrics.parquet",
        plots=directory(f"{RESULTS}/{{method}}/plots"),
    params:
        hp=hp,
        scale=SCALE,
        tracking=config["tracking"],
    log:
        f"{RESULTS}/logs/{{method}}/evaluate.log",
    conda:
        method_env
    threads: 1
    resources:
        mem_mb=lambda w, attempt: 2000 * attempt,
        runtime=lambda w, attempt: 10 * attempt,
    script:
        STAGE


rule verify:
    input:
        table=rules.evaluate.output.table,
    output:
        claims=f"{RESULTS}/{{method}}/claims.json",
    params:
        scale=SCALE,
        tracking=config["tracking"],
    log:
        f"{RESULTS}/logs/{{method}}/verify.log",
    conda:
        env_file("core")
    threads: 1
    resources:
        mem_mb=lambda w, attempt: 1000 * attempt,
        runtime=lambda w, attempt: 5 * attempt,
    script:
        STAGE
