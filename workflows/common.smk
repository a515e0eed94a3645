# Shared set-up: validate config, build the plan from the registries, tracking hooks.
import sys
from pathlib import Path

# the workflow imports the package from the checkout (jobs do the same in scripts/stage.py)
_SRC = str(Path(workflow.basedir) / "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)

from reprozoo import codehash as rz_code
from reprozoo import config as rz_config
from reprozoo import registry as rz_registry
from reprozoo.data import registry as rz_data

from reprozoo.strict_yaml import load as _strict_load

for _cf in workflow.configfiles:  # Snakemake's own YAML reader keeps the last of two equal keys silently
    _strict_load(_cf)
rz_config.validate(config)
PLAN = rz_config.plan(config, check_specs=workflow.is_main_process)  # names, overrides, claim metrics: before any job runs
SCALE = PLAN.scale
RESULTS = "results"
# one results tree per scale: a ci run never touches smoke results (data is per scale already)
RS = f"{RESULTS}/{SCALE}"
ENVS = Path(workflow.basedir) / "envs"
STAGE = "scripts/stage.py"
# at ci/smoke a method's variant x seed cells run in one job (job start-up, ~2-4 s of imports,
# would otherwise dominate); at paper scale every cell is its own job so a cluster fans them out
from reprozoo.tracking import mode_for as _tracking_mode

# deferred at ci/smoke: jobs write their runs as files and the end hook logs them in one process
TRACKING = dict(config["tracking"])
TRACKING["mode"] = _tracking_mode(TRACKING.get("mode", "auto"), SCALE, TRACKING.get("uri"))
FANOUT = config.get("fanout", "auto")
if FANOUT == "auto":
    FANOUT = "cell" if SCALE == "paper" else "method"


wildcard_constraints:
    method="|".join(rz_registry.method_ids()) or "NONE",
    dataset="|".join(rz_data.names()) or "NONE",
    scale="ci|smoke|paper",
    seed=r"\d+",
    variant=r"[A-Za-z0-9][A-Za-z0-9_]*",
    selection=r"(partial/[^/]+/)?",
    tag=r"[0-9a-f]{8}",


def env_file(name):
    return str(ENVS / f"{name}.yaml")


def method_env(wildcards):
    return env_file(rz_registry.get(wildcards.method).env)


def method_res(wildcards, key):
    return rz_registry.get(wildcards.method).resources_for(SCALE)[key]


def hp(wildcards):
    return rz_config.method_params(config, wildcards.method)


def code(wildcards):
    """Content hash of the code the method's jobs run: editing it reruns exactly those jobs."""
    return rz_code.method_code_hash(wildcards.method)


def spec_hash(wildcards):
    """The method's spec (its claims) feeds verify only: editing a claim re-verifies, never retrains."""
    import hashlib

    return hashlib.sha256((rz_registry.get(wildcards.method).folder / "spec.yaml").read_bytes()).hexdigest()[:16]


def dataset_code(wildcards):
    return rz_code.dataset_code_hash(rz_data.get(wildcards.dataset).module_name)


def data_dirs(method):
    return {d: f"{RESULTS}/data/{d}/{SCALE}" for d in rz_registry.get(method).datasets_for(SCALE)}


def data_cards(wildcards):
    return [f"{d}/card.json" for d in data_dirs(wildcards.method).values()]


def dataset_env(wildcards):
    return env_file(rz_data.get(wildcards.dataset).env)


def _cells_prefix(wildcards):
    tag = getattr(wildcards, "tag", None)
    return f"partial/params-{tag}/" if tag else ""


def shared_input(wildcards):
    if rz_registry.get(wildcards.method).train_shared:
        return [f"{RS}/{wildcards.method}/{_cells_prefix(wildcards)}_shared/seed{wildcards.seed}/done.json"]
    return []


def shared_dir(wildcards):
    if rz_registry.get(wildcards.method).train_shared:
        return f"{RS}/{wildcards.method}/{_cells_prefix(wildcards)}_shared/seed{wildcards.seed}"
    return None


def cells_dir(method):
    """Where a method's variant x seed cells live: results/<scale>/<method>/, or its
    partial/params-<hash>/ folder when its hyper-parameters are overridden."""
    return f"{RS}/{method}/{PLAN.cell_root(method)}"


def cell_outputs(method):
    return [f"{cells_dir(method)}{v}/seed{s}/metrics.json" for v in PLAN.variants[method] for s in PLAN.seeds[method]]


def train_outputs(wildcards):
    return cell_outputs(wildcards.method)


def selection_dir(method):
    """Evaluate/verify outputs of a complete selection live in results/<scale>/<method>/; a subset
    of variants or other seeds goes to .../partial/<selection>/ and cannot overwrite them."""
    return f"{RS}/{method}/{PLAN.selection(method)}"


REPORT_DIR = f"{RS}/{PLAN.report_selection()}"


onstart:
    from reprozoo import tracking as rz_tracking

    _uri = rz_tracking.resolve_uri(config["tracking"]["uri"])
    print(f"reprozoo: tracking to {_uri}; scale={SCALE}; methods={PLAN.methods}; results in {RS}/")
    rz_tracking.start_invocation(_uri, Path(RESULTS), SCALE, dict(config))
    if TRACKING["mode"] == "live":  # deferred: one thread of this process logs finished jobs
        rz_tracking.init_store_or_warn(_uri, PLAN.methods, Path(RESULTS))
    else:
        rz_tracking.start_background_replay(Path(RESULTS), TRACKING)


onsuccess:
    from reprozoo import tracking as rz_tracking
    from reprozoo.report import print_verdicts

    rz_tracking.replay_or_warn(Path(RESULTS), TRACKING)
    rz_tracking.finish_invocation(Path(RESULTS), "FINISHED")
    print_verdicts([f"{selection_dir(m)}claims.json" for m in PLAN.methods])


onerror:
    from reprozoo import tracking as rz_tracking

    rz_tracking.replay_or_warn(Path(RESULTS), TRACKING)
    rz_tracking.finish_invocation(Path(RESULTS), "FAILED")
