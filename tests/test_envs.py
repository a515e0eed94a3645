"""The per-rule software environments (envs/*.yaml) must not rot.

* every environment file parses, is pinned, extends core, and agrees with requirements.txt;
* requirements.txt and pyproject.toml declare the same pinned dependencies;
* every rule that runs code names an environment with `conda:`, and the names resolve to files;
* every third-party package imported by code that runs in an environment is declared in that
  environment and in the project's dependency list: a method's code (src/reprozoo/methods/<id>/,
  plus the reprozoo modules it imports, transitively) in the env of its spec.yaml; a dataset's module
  (src/reprozoo/data/<family>/...) in the env the data registry gives its acquire/preprocess rules;
  the stage code (workflows/scripts/stage.py -> reprozoo.stages ...) in every env.

Imports are read with ``ast`` (nothing is imported), including imports inside functions. An import
inside ``try: ... except ImportError`` is optional: an optional package that is not declared must be
listed in OPTIONAL_IMPORTS with the reason. ``if "pkg" in sys.modules: import pkg`` imports nothing
new and is skipped. Import names map to distributions through IMPORT_TO_DIST:
an import missing from it fails the test, so the mapping stays explicit.
"""
from __future__ import annotations

import ast
import functools
import re
import shutil
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from reprozoo import registry
from reprozoo.data import registry as data_registry

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
ENVS = ROOT / "envs"
STAGE_SCRIPT = ROOT / "workflows" / "scripts" / "stage.py"

# import name -> distribution name (as in requirements.txt / pip), for every third-party import
IMPORT_TO_DIST = {
    "numpy": "numpy", "scipy": "scipy", "pandas": "pandas", "pyarrow": "pyarrow",
    "matplotlib": "matplotlib", "mpl_toolkits": "matplotlib", "yaml": "pyyaml",
    "jsonschema": "jsonschema", "mlflow": "mlflow", "snakemake": "snakemake", "sqlalchemy": "sqlalchemy",
    "torch": "torch", "torchvision": "torchvision", "torchaudio": "torchaudio",
    "torch_geometric": "torch-geometric", "torch_scatter": "torch-scatter",
    "torch_cluster": "torch-cluster", "e3nn": "e3nn", "opt_einsum": "opt-einsum",
    "mne": "mne", "ase": "ase", "pymatgen": "pymatgen", "spglib": "spglib", "h5py": "h5py",
    "pooch": "pooch", "statsmodels": "statsmodels", "sklearn": "scikit-learn",
    "skimage": "scikit-image", "PIL": "pillow", "cv2": "opencv-python", "requests": "requests",
    "threadpoolctl": "threadpoolctl", "mp_api": "mp-api", "diffusers": "diffusers",
    "transformers": "transformers", "sktime": "sktime", "MDAnalysis": "mdanalysis",
    "MDAnalysisTests": "mdanalysistests",
    "global_land_mask": "global-land-mask", "sympy": "sympy", "networkx": "networkx",
    "tqdm": "tqdm", "joblib": "joblib", "numba": "numba", "xarray": "xarray", "netCDF4": "netcdf4",
    "psutil": "psutil", "filelock": "filelock", "packaging": "packaging", "vesin": "vesin",
    "tensorly": "tensorly", "pyshtools": "pyshtools", "zuko": "zuko", "sbi": "sbi",
    "ot": "pot", "snntorch": "snntorch", "neurokit2": "neurokit2", "pypots": "pypots", "zfpy": "zfpy",
}

# packages needed at run time that no `import` names
RUNTIME_EXTRAS = {"pandas": ["pyarrow"]}  # DataFrame.to_parquet / read_parquet (the stages use them)

# optional imports (inside try/except ImportError) deliberately left out of the environments
OPTIONAL_IMPORTS = {
    "diffusers": "rex's paper-scale pretrained DDPM backend; GPU users install it (README 'GPU installs')",
    "mp_api": "remote source of the Materials Project elasticity data (needs an API key)",
    "threadpoolctl": "thread limiting when present (it comes with scikit-learn); not required",
    "transformers": "vit_binding's paper-scale pretrained DINOv2 backend (weights need a download); GPU users install it",
}


def norm(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


# --- dependency lists --------------------------------------------------------------------------

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;#]+)")


def requirements(path: Path = ROOT / "requirements.txt") -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = PIN.match(line)
        assert m, f"requirements.txt: '{line}' is not pinned with =="
        out[norm(m.group(1))] = m.group(3)
    return out


def pyproject_deps(path: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    project = tomllib.loads(path.read_text())["project"]
    specs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        specs += extra
    out = {}
    for s in specs:
        m = PIN.match(s.strip())
        assert m, f"pyproject.toml: '{s}' is not pinned with =="
        out[norm(m.group(1))] = m.group(3)
    return out


@dataclass
class Env:
    name: str
    path: Path
    pip: dict[str, str] = field(default_factory=dict)
    conda: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def declared(self) -> set[str]:
        return set(self.pip) | set(self.conda)


def load_env(path: Path) -> Env:
    env = Env(path.stem, path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        env.problems.append(f"{path.name}: does not parse: {exc}")
        return env
    if not isinstance(data, dict) or not isinstance(data.get("dependencies"), list):
        env.problems.append(f"{path.name}: needs a mapping with a 'dependencies' list")
        return env
    if data.get("name") != f"reprozoo-{path.stem}":
        env.problems.append(f"{path.name}: name should be reprozoo-{path.stem}, is {data.get('name')!r}")
    if not data.get("channels"):
        env.problems.append(f"{path.name}: no channels")
    for dep in data["dependencies"]:
        if isinstance(dep, dict):
            for item in dep.get("pip", []):
                m = PIN.match(str(item).strip())
                if not m:
                    env.problems.append(f"{path.name}: pip dependency '{item}' is not pinned with ==")
                else:
                    env.pip[norm(m.group(1))] = m.group(3)
        else:
            m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*=\s*([^=\s][^\s]*)", str(dep).strip())
            if not m:
                env.problems.append(f"{path.name}: conda dependency '{dep}' is not pinned with =")
            else:
                env.conda[norm(m.group(1))] = m.group(2)
    if "python" not in env.conda:
        env.problems.append(f"{path.name}: python is not pinned")
    return env


def load_envs(envs_dir: Path = ENVS) -> dict[str, Env]:
    return {p.stem: load_env(p) for p in sorted(envs_dir.glob("*.yaml"))}


# --- imports -----------------------------------------------------------------------------------

def module_path(mod: str) -> Path | None:
    base = SRC.joinpath(*mod.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def module_name(path: Path) -> str:
    rel = path.resolve().relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    names = []
    t = handler.type
    for node in ([] if t is None else (t.elts if isinstance(t, ast.Tuple) else [t])):
        names.append(node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", ""))
    return any(n in ("ImportError", "ModuleNotFoundError") for n in names)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _tests_sys_modules(test: ast.expr) -> bool:
    """``"pkg" in sys.modules``: the import below runs only where something else imported it."""
    return (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.In)
            and isinstance(test.comparators[0], ast.Attribute) and test.comparators[0].attr == "modules"
            and getattr(test.comparators[0].value, "id", "") == "sys")


class _Imports(ast.NodeVisitor):
    """(module, guarded) for every import in a file, relative imports resolved."""

    def __init__(self, package: str):
        self.package, self.guard, self.found = package, 0, []

    def visit_Try(self, node):
        guarded = any(_catches_import_error(h) for h in node.handlers)
        self.guard += guarded
        for n in node.body:
            self.visit(n)
        self.guard -= guarded
        for n in node.handlers + node.orelse + node.finalbody:
            self.visit(n)

    visit_TryStar = visit_Try

    def visit_If(self, node):
        if _is_type_checking(node.test):
            for n in node.orelse:
                self.visit(n)
            return
        if _tests_sys_modules(node.test):  # `if "torch" in sys.modules: import torch` imports nothing new
            for n in node.orelse:
                self.visit(n)
            return
        self.generic_visit(node)

    def visit_Import(self, node):
        for a in node.names:
            self.found.append((a.name, self.guard > 0))

    def visit_ImportFrom(self, node):
        if node.level:
            parts = self.package.split(".")
            base = parts[: len(parts) - (node.level - 1)]
            mod = ".".join(base + ([node.module] if node.module else []))
        else:
            mod = node.module or ""
        self.found.append((mod, self.guard > 0))
        for a in node.names:  # `from pkg import submodule`
            if module_path(f"{mod}.{a.name}") is not None:
                self.found.append((f"{mod}.{a.name}", self.guard > 0))


@functools.lru_cache(maxsize=None)
def file_imports(path: Path) -> tuple[tuple[str, bool], ...]:
    mod = module_name(path) if SRC in path.resolve().parents else "__main__"
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    visitor = _Imports(package or "reprozoo")
    visitor.visit(ast.parse(path.read_text(), filename=str(path)))
    return tuple(visitor.found)


@dataclass
class Closure:
    files: set[Path] = field(default_factory=set)
    required: dict[str, set[str]] = field(default_factory=dict)  # top-level import -> files
    optional: dict[str, set[str]] = field(default_factory=dict)


def closure(roots: list[Path]) -> Closure:
    """Third-party imports of ``roots`` and of every reprozoo module they import, transitively."""
    out, todo = Closure(), list(roots)
    while todo:
        path = todo.pop()
        if path in out.files:
            continue
        out.files.add(path)
        for mod, guarded in file_imports(path):
            top = mod.split(".")[0]
            if top == "reprozoo":
                parts = mod.split(".")
                for i in range(1, len(parts) + 1):  # a module imports its parent packages too
                    p = module_path(".".join(parts[:i]))
                    if p is not None and p not in out.files:
                        todo.append(p)
            elif top and top != "__future__" and top not in sys.stdlib_module_names:
                where = str(path.relative_to(ROOT) if ROOT in path.parents else path)
                (out.optional if guarded else out.required).setdefault(top, set()).add(where)
    for top in [t for t in out.optional if t in out.required]:
        out.optional.pop(top)
    return out


def py_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def stage_roots() -> list[Path]:
    return [STAGE_SCRIPT, module_path("reprozoo.stages")]


# --- which code runs in which environment ------------------------------------------------------

def code_by_env() -> dict[str, dict[str, list[Path]]]:
    """env -> {what: root files}: methods' code, datasets' code, and the stage code everywhere."""
    out: dict[str, dict[str, list[Path]]] = {}
    for spec in registry.all_specs():
        out.setdefault(spec.env, {})[f"method {spec.id}"] = py_files(spec.folder)
    reached: set[Path] = set()
    family_envs: dict[str, set[str]] = {}
    for name in data_registry.names():
        d = data_registry.get(name)
        root = module_path(d.module_name)
        assert root is not None, f"dataset {name}: module {d.module_name} not found under src/"
        out.setdefault(d.env, {})[f"dataset {name}"] = [root]
        reached |= closure([root]).files
        family_envs.setdefault(d.family, set()).add(d.env)
    for family, envs in family_envs.items():  # helpers no dataset module imports statically
        rest = [p for p in py_files(SRC / "reprozoo" / "data" / family) if p not in reached]
        for env in envs:
            if rest:
                out[env][f"data family {family} (other files)"] = rest
    for env in list(out) + ["core"]:
        out.setdefault(env, {})["stage code"] = stage_roots()
    return out


def check(envs: dict[str, Env], reqs: dict[str, str]) -> list[str]:
    """Every problem found, as readable lines (empty: all good)."""
    problems = [p for e in envs.values() for p in e.problems]
    for env_name, parts in sorted(code_by_env().items()):
        env = envs.get(env_name)
        if env is None:
            problems.append(f"envs/{env_name}.yaml is named by the workflow but does not exist")
            continue
        for what, roots in parts.items():
            c = closure(roots)
            for imp, files in sorted(c.required.items()):
                dist = IMPORT_TO_DIST.get(imp)
                if dist is None:
                    problems.append(f"{what}: import '{imp}' ({sorted(files)[0]}) is not in IMPORT_TO_DIST "
                                    f"in tests/test_envs.py: add its distribution name")
                    continue
                for d in [dist] + RUNTIME_EXTRAS.get(imp, []):
                    if norm(d) not in env.declared:
                        problems.append(f"{what}: imports '{imp}' ({sorted(files)[0]}) but envs/{env_name}.yaml "
                                        f"does not declare '{d}'")
                    if norm(d) not in reqs:
                        problems.append(f"{what}: imports '{imp}' ({sorted(files)[0]}) but requirements.txt "
                                        f"does not declare '{d}'")
            for imp, files in sorted(c.optional.items()):
                dist = IMPORT_TO_DIST.get(imp, imp)
                if norm(dist) not in env.declared and imp not in OPTIONAL_IMPORTS:
                    problems.append(f"{what}: optional import '{imp}' ({sorted(files)[0]}) is neither declared "
                                    f"in envs/{env_name}.yaml nor listed in OPTIONAL_IMPORTS (with the reason)")
    return sorted(set(problems))


# --- tests -------------------------------------------------------------------------------------

def test_environment_files_parse_are_pinned_and_extend_core():
    envs = load_envs()
    assert {"core", "torch", "eeg", "atomistic"} <= set(envs)
    problems = [p for e in envs.values() for p in e.problems]
    core = envs["core"]
    for e in envs.values():
        missing = sorted(set(core.pip) - set(e.pip))
        if missing:
            problems.append(f"{e.path.name}: does not extend core (missing {missing})")
        if e.conda.get("python") != core.conda.get("python"):
            problems.append(f"{e.path.name}: python {e.conda.get('python')} differs from core's")
    assert not problems, "\n".join(problems)


def test_environment_pins_agree_with_requirements():
    reqs = requirements()
    problems = []
    for e in load_envs().values():
        for dist, ver in e.pip.items():
            if dist not in reqs:
                problems.append(f"{e.path.name}: '{dist}' is not in requirements.txt")
            elif reqs[dist] != ver:
                problems.append(f"{e.path.name}: {dist}=={ver} but requirements.txt pins {reqs[dist]}")
    assert not problems, "\n".join(problems)


def test_requirements_and_pyproject_declare_the_same_pins():
    reqs, proj = requirements(), pyproject_deps()
    assert reqs == proj, (f"only in requirements.txt: {sorted(set(reqs.items()) - set(proj.items()))}; "
                          f"only in pyproject.toml: {sorted(set(proj.items()) - set(reqs.items()))}")


RULE = re.compile(r"^( *)rule( \w+)?:\s*$", re.M)


def _rule_blocks():
    """Every rule's body, dedented to the rule's own level (rules may sit inside ``if``/``for``
    blocks, e.g. the per-method batch rules; an anonymous rule is named by its ``name:``)."""
    import textwrap

    for smk in [ROOT / "Snakefile", *sorted((ROOT / "workflows").glob("*.smk"))]:
        text = smk.read_text()
        starts = [m for m in RULE.finditer(text)]
        for m, nxt in zip(starts, starts[1:] + [None]):
            indent = len(m.group(1))
            body = text[m.end(): nxt.start() if nxt else len(text)]
            lines = [ln for ln in body.splitlines() if not ln.strip() or len(ln) - len(ln.lstrip()) > indent]
            body = textwrap.indent(textwrap.dedent("\n".join(lines)), "    ")
            name = (m.group(2) or "").strip()
            if not name:
                named = re.search(r"^    name:\s*\n\s+(.+?)\s*$", body, re.M)
                name = named.group(1) if named else "<anonymous>"
            yield smk.name, name, body


def test_every_rule_that_runs_code_names_an_environment():
    envs = load_envs()
    problems, seen = [], 0
    for where, rule, body in _rule_blocks():
        runs_code = re.search(r"^    (script|shell|run|notebook|wrapper):", body, re.M)
        conda = re.search(r"^    conda:\s*\n\s+(.+?)\s*$", body, re.M) or re.search(r"^    conda:\s*(\S.*?)\s*$", body, re.M)
        if not runs_code:
            continue
        seen += 1
        if not conda:
            problems.append(f"{where}: rule {rule} runs code but has no conda:")
            continue
        value = conda.group(1)
        m = re.fullmatch(r"env_file\(\s*[\"'](\w+)[\"']\s*\)", value)
        if m:
            if m.group(1) not in envs:
                problems.append(f"{where}: rule {rule}: conda env_file('{m.group(1)}') has no envs/{m.group(1)}.yaml")
        elif value not in ("method_env", "dataset_env", "env_file(_spec.env)"):
            problems.append(f"{where}: rule {rule}: conda: {value} is not one the test knows how to resolve")
    assert seen >= 7 and not problems, "\n".join(problems)
    # what the two functions return: each method's spec env and each dataset's registry env
    for spec in registry.all_specs():
        assert spec.env in envs, f"method {spec.id}: env '{spec.env}' has no envs/{spec.env}.yaml"
    for name in data_registry.names():
        env = data_registry.get(name).env
        assert env in envs, f"dataset {name}: env '{env}' has no envs/{env}.yaml"


def test_every_imported_package_is_declared_in_its_environment_and_the_requirements():
    problems = check(load_envs(), requirements())
    assert not problems, "\n".join(problems)


def test_the_check_fails_when_a_dependency_is_removed(tmp_path):
    """Remove, one at a time, a package each environment's code imports: the check must notice."""
    envs_dir = tmp_path / "envs"
    shutil.copytree(ENVS, envs_dir)
    reqs = requirements()
    baseline = set(check(load_envs(envs_dir), reqs))
    tried = 0
    for env_name, parts in sorted(code_by_env().items()):
        imports = set()
        for roots in parts.values():
            imports |= set(closure(roots).required)
        dists = sorted({IMPORT_TO_DIST[i] for i in imports if i in IMPORT_TO_DIST} - {"numpy"})
        declared = load_env(ENVS / f"{env_name}.yaml").pip
        victim = next((d for d in reversed(dists) if norm(d) in declared), None)
        if victim is None:
            continue
        path = envs_dir / f"{env_name}.yaml"
        original = path.read_text()
        path.write_text("\n".join(l for l in original.splitlines()
                                  if not re.match(rf"\s*-\s*{re.escape(victim)}==", l, re.I)) + "\n")
        new = set(check(load_envs(envs_dir), reqs)) - baseline
        assert any(f"envs/{env_name}.yaml does not declare '{victim}'" in p for p in new), \
            f"removing {victim} from {env_name}.yaml went unnoticed"
        path.write_text(original)
        tried += 1
    assert tried >= 2
    # and a file that does not parse is reported
    (envs_dir / "core.yaml").write_text("name: [unclosed\n")
    assert any("does not parse" in p for p in check(load_envs(envs_dir), reqs))


def test_import_scanner_resolves_relative_imports_and_skips_guarded_ones(tmp_path):
    c = closure([module_path("reprozoo.stages")])
    names = {module_name(p) for p in c.files}
    assert {"reprozoo", "reprozoo.stages", "reprozoo.registry", "reprozoo.tracking", "reprozoo.io"} <= names
    assert {"mlflow", "yaml", "numpy"} <= set(c.required)
    probe = tmp_path / "probe.py"  # outside src/: relative imports resolve against the reprozoo package
    probe.write_text("try:\n    import not_a_real_pkg\nexcept ImportError:\n    pass\n"
                     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import also_not_real\n"
                     "from .io import read_json\n")
    c = closure([probe])
    assert "not_a_real_pkg" in c.optional and "not_a_real_pkg" not in c.required
    assert "also_not_real" not in c.required
    assert module_path("reprozoo.io") in c.files
