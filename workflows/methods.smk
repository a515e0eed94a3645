# Method stages, generic over the registry: train_shared (optional) -> train (variant x seed)
# -> evaluate -> verify. Resources come from each method's spec for the configured scale and grow
# with the attempt number; a job is retried only after resource exhaustion (see reprozoo.stages).
#
# FANOUT "cell" (paper scale): one train_shared job per seed and one train job per variant x seed,
# so a cluster runs them in parallel. FANOUT "method" (ci, smoke): one train_batch_<method> job
# runs all of a method's cells in one process, paying job start-up once. Both write the same files.

if FANOUT == "cell":
    # twice: the default configuration's cells, and those of a hyper-parameter override under
    # partial/params-<tag>/ (their own rules, so the default jobs carry no empty wildcard: SLURM
    # names job logs after the wildcards)
    for _sfx, _pre in (("", ""), ("_override", "partial/params-{tag}/")):

        rule:
            name:
                f"train_shared{_sfx}"
            input:
                cards=data_cards,
            output:
                done=f"{RS}/{{method}}/{_pre}_shared/seed{{seed}}/done.json",
            params:
                hp=hp,
                code=code,
                scale=SCALE,
                data=lambda w: data_dirs(w.method),
                tracking=TRACKING,
            log:
                f"{RS}/logs/{{method}}/{_pre}train_shared-seed{{seed}}.log",
            benchmark:
                f"{RS}/benchmarks/{{method}}/{_pre}train_shared-seed{{seed}}.tsv"
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

        rule:
            name:
                f"train{_sfx}"
            input:
                cards=data_cards,
                shared=shared_input,
            output:
                metrics=f"{RS}/{{method}}/{_pre}{{variant}}/seed{{seed}}/metrics.json",
            params:
                hp=hp,
                code=code,
                scale=SCALE,
                data=lambda w: data_dirs(w.method),
                shared_dir=shared_dir,
                tracking=TRACKING,
            log:
                f"{RS}/logs/{{method}}/{_pre}train-{{variant}}-seed{{seed}}.log",
            benchmark:
                f"{RS}/benchmarks/{{method}}/{_pre}train-{{variant}}-seed{{seed}}.tsv"
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

else:
    for _m in PLAN.methods:
        _spec = rz_registry.get(_m)
        _res = _spec.resources_for(SCALE)
        _shared = (
            [f"{cells_dir(_m)}_shared/seed{s}/done.json" for s in PLAN.seeds[_m]] if _spec.train_shared else []
        )

        rule:
            name:
                f"train_batch_{_m}"
            input:
                cards=[f"{d}/card.json" for d in data_dirs(_m).values()],
            output:
                metrics=cell_outputs(_m),
                shared=_shared,
            params:
                method=_m,
                hp=rz_config.method_params(config, _m),
                code=rz_code.method_code_hash(_m),
                scale=SCALE,
                data=data_dirs(_m),
                cells=[[v, s] for s in PLAN.seeds[_m] for v in PLAN.variants[_m]],
                seeds=PLAN.seeds[_m],
                tracking=TRACKING,
            log:
                f"{RS}/logs/{_m}/{PLAN.selection(_m)}train_batch.log",
            benchmark:
                f"{RS}/benchmarks/{_m}/{PLAN.selection(_m)}train_batch.tsv"
            conda:
                env_file(_spec.env)
            threads: _res["threads"]
            resources:
                mem_mb=lambda w, attempt, _r=_res: _r["mem_mb"] * attempt,
                runtime=lambda w, attempt, _r=_res, _n=len(PLAN.variants[_m]) * len(PLAN.seeds[_m]): _r["runtime"] * _n * attempt,
                gpu=_res["gpu"],
                attempt=lambda w, attempt: attempt,
            script:
                STAGE


rule evaluate:
    input:
        metrics=train_outputs,
    output:
        table=f"{RS}/{{method}}/{{selection}}metrics.parquet",
        plots=report(  # Snakemake's report: every figure, by wave and method (workflows/report.smk)
            directory(f"{RS}/{{method}}/{{selection}}plots"),
            patterns=["{name}.png"],
            caption="report/plots.rst",
            category=lambda w: rz_registry.get(w.method).wave,
            subcategory="{method}",
            labels={"method": "{method}", "figure": "{name}"},
        ),
    params:
        hp=hp,
        code=code,
        scale=SCALE,
    log:
        f"{RS}/logs/{{method}}/{{selection}}evaluate.log",
    benchmark:
        f"{RS}/benchmarks/{{method}}/{{selection}}evaluate.tsv"
    conda:
        method_env
    threads: 1
    resources:
        mem_mb=lambda w, attempt: 2000 * attempt,
        runtime=lambda w, attempt: 10 * attempt,
        attempt=lambda w, attempt: attempt,
    script:
        STAGE


rule verify:
    input:
        table=rules.evaluate.output.table,
        plots=rules.evaluate.output.plots,
    output:
        claims=f"{RS}/{{method}}/{{selection}}claims.json",
    params:
        scale=SCALE,
        spec=spec_hash,
        variants=lambda w: PLAN.variants[w.method],
        seeds=lambda w: PLAN.seeds[w.method],
        config={k: config.get(k) for k in ("scale", "seeds", "variants", "params", "data")},
        tracking=TRACKING,
    log:
        f"{RS}/logs/{{method}}/{{selection}}verify.log",
    benchmark:
        f"{RS}/benchmarks/{{method}}/{{selection}}verify.tsv"
    conda:
        env_file("core")
    threads: 1
    resources:
        mem_mb=lambda w, attempt: 1000 * attempt,
        runtime=lambda w, attempt: 5 * attempt,
        attempt=lambda w, attempt: attempt,
    script:
        STAGE
