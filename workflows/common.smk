# Shared set-up: validate config, build the plan from the registries, tracking hooks.
import sys
from pathlib import Path

# the workflow imports the package from the checkout (jobs do the same in scripts/stage.py)
_SRC = str(Path(workflow.basedir) / "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)

from reprozoo import config as rz_config
from reprozoo import registry as rz_registry
from reprozoo.data import registry as rz_data

rz_config.validate(config)
PLAN = rz_config.plan(config)
SCALE = PLAN.scale
RESULTS = "results"
ENVS = Path(workflow.basedir) / "envs"
STAGE = "scripts/stage.py"


wildcard_constraints:
    method="|".join(rz_registry.method_ids()) or "NONE",
    dataset="|".join(rz_data.names()) or "NONE",
    scale="ci|smoke|paper",
    seed=r"\d+",
    variant=r"[A-Za-z0-9][A-Za-z0-9_]*",


def env_file(name):
    return str(ENVS / f"{name}.yaml")


def method_env(wildcards):
    return env_file(rz_registry.get(wildcards.method).env)


def method_res(wildcards, key):
    return rz_registry.get(wildcards.method).resources_for(SCALE)[key]


def hp(wildcards):
    return rz_config.method_params(config, wildcards.method)


def data_dirs(method):
    return {d: f"{RESULTS}/data/{d}/{SCALE}" for d in rz_registry.get(method).datasets_for(SCALE)}


def data_cards(wildcards):
    return [f"{d}/card.json" for d in data_dirs(wildcards.method).values()]


def dataset_env(wildcards):
    return env_file(rz_data.get(wildcards.dataset).env)


def shared_input(wildcards):
    if rz_registry.get(wildcards.method).train_shared:
        return [f"{RESULTS}/{wildcards.method}/_shared/seed{wildcards.seed}/done.json"]
    return []


def shared_dir(wildcards):
    if rz_registry.get(wildcards.method).train_shared:
        return f"{RESULTS}/{wildcards.method}/_shared/seed{wildcards.seed}"
    return None


def train_outputs(wildcards):
    m = wildcards.method
    return [
        f"{RESULTS}/{m}/{v}/seed{s}/metrics.json"
        for v in PLAN.variants[m]
        for s in PLAN.seeds[m]
    ]


onstart:
    from reprozoo import tracking as rz_tracking

    _uri = rz_tracking.resolve_uri(config["tracking"]["uri"])
    print(f"reprozoo: tracking to {_uri}; scale={SCALE}; methods={PLAN.methods}")
    rz_tracking.start_invocation(_uri, Path(RESULTS), SCALE, dict(config))
    rz_tracking.init_store_or_warn(_uri, PLAN.methods, Path(RESULTS))


onsuccess:
    from reprozoo import tracking as rz_tracking

    rz_tracking.finish_invocation(Path(RESULTS), "FINISHED")


onerror:
    from reprozoo import tracking as rz_tracking

    rz_tracking.finish_invocation(Path(RESULTS), "FAILED")
