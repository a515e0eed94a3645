# Shared set-up: validate config, build the plan from the registries, tracking hooks.
import os
import sys
from pathlib import Path

_SRC = str(Path(workflow.basedir) / "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
# jobs (local subprocesses, SLURM jobs, conda envs) import the same package
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in [_SRC, os.environ.get("PYTHONPATH", "")] if p
)

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
    return {d: f"{RESULTS}/data/{d}/{SCALE}" for d in rz_registry.get(method).datasets}


def data_cards(wildcards):
    return [f"{d}/card.json" for d in data_dirs(wildcards.method).values()]


onstart:
    from reprozoo import tracking as rz_tracking

    _uri = rz_tracking.resolve_uri(config["tracking"]["uri"])
    print(f"reprozoo: tracking to {_uri}; scale={SCALE}; methods={PLAN.methods}")
    rz_tracking.init_store(_uri, PLAN.methods, Path(RESULTS))
    rz_tracking.start_invocation(_uri, Path(RESULTS), SCALE, dict(config))


onsuccess:
    from reprozoo import tracking as rz_tracking

    rz_tracking.finish_invocation(Path(RESULTS), "FINISHED")


onerror:
    from reprozoo import tracking as rz_tracking

    rz_tracking.finish_invocation(Path(RESULTS), "FAILED")
