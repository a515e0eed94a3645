"""Content hashes of the code a job runs, so that editing it reruns exactly the jobs it affects.

Every rule runs one dispatcher script (``workflows/scripts/stage.py``), so Snakemake's own code
trigger sees only that script, never the method code behind it. Each job therefore carries, as a
param, a hash of the source it actually executes: the method folder's Python files plus every
module under ``reprozoo.blocks`` and ``reprozoo.data`` that they import, followed transitively.
Snakemake's params trigger then reruns a method's jobs when its own code or a block it imports
changes, and no others. Imports are found by parsing (``ast``), not by importing, so planning
stays fast and torch-free.
"""
from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
PACKAGE = PACKAGE_DIR.name  # "reprozoo"
# sub-packages whose modules count as "the code a job runs" beyond its own folder
TRACKED = ("blocks", "data", "methods")


def _module_file(module: str) -> Path | None:
    """The source file of a dotted ``reprozoo.*`` module name, or None outside the package."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    base = PACKAGE_DIR.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE_DIR).with_suffix("")
    parts = [PACKAGE, *rel.parts]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


@functools.lru_cache(maxsize=None)
def imports_of(path: Path) -> tuple[Path, ...]:
    """Files of the ``reprozoo`` modules that ``path`` imports (absolute and relative imports)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = _module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names.add(mod)
            names.update(f"{mod}.{a.name}" for a in node.names)  # "from pkg import submodule"
    files = set()
    for name in names:
        parts = name.split(".")
        # a module's parent packages run too (their __init__), e.g. reprozoo.blocks.atomistic
        for k in range(2, len(parts) + 1):
            sub = parts[:k]
            if len(sub) < 2 or sub[1] not in TRACKED:
                continue
            f = _module_file(".".join(sub))
            if f is not None:
                files.add(f)
    return tuple(sorted(files))


def closure(roots: list[Path]) -> list[Path]:
    """Every tracked source file reachable from ``roots`` by imports."""
    seen: set[Path] = set()
    todo = [p.resolve() for p in roots]
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        todo.extend(p for p in imports_of(f) if p not in seen)
    return sorted(seen)


def digest(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(str(f.relative_to(PACKAGE_DIR)).encode())
        h.update(b"\0")
        h.update(f.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def method_code_files(method: str) -> tuple[Path, ...]:
    folder = PACKAGE_DIR / "methods" / method
    return tuple(closure(sorted(folder.rglob("*.py"))))


@functools.lru_cache(maxsize=None)
def method_code_hash(method: str) -> str:
    """Hash of the Python a method's jobs execute (its folder and the blocks/data it imports)."""
    return digest(list(method_code_files(method)))


@functools.lru_cache(maxsize=None)
def dataset_code_hash(module: str) -> str:
    """Hash of a dataset module (dotted name under ``reprozoo.data``) and what it imports."""
    f = _module_file(module if module.startswith(PACKAGE) else f"{PACKAGE}.data.{module}")
    return digest(closure([f])) if f else "none"


# platform modules that decide a method's numbers and verdicts besides its own code
VERDICT_CODE = ("claims.py", "registry.py", "runtime.py", "stages.py")


def provenance_files(method: str) -> list[Path]:
    """Everything a method's table depends on: its code closure, its spec and configs, and the
    platform modules that run it and decide its verdicts."""
    folder = PACKAGE_DIR / "methods" / method
    extra = [folder / "spec.yaml", *sorted((folder / "configs").glob("*.yaml"))]
    return sorted(set(method_code_files(method)) | {PACKAGE_DIR / f for f in VERDICT_CODE}
                  | {f for f in extra if f.exists()})


def provenance(method: str) -> dict:
    """``{"git_commit", "code_hash", "dirty_files"}`` of a method's results, for pages that a rerun
    of the named commit reproduces: ``dirty_files`` lists the files of :func:`provenance_files`
    that differ from that commit (uncommitted edits elsewhere in the tree do not count)."""
    import subprocess

    files = provenance_files(method)
    root = PACKAGE_DIR.parents[1]
    commit, dirty = "unknown", []
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=5).stdout.strip() or "unknown"
        rel = [str(f.relative_to(root)) for f in files]
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", *rel], cwd=root,
                             capture_output=True, text=True, timeout=10).stdout
        dirty = sorted(line[3:] for line in out.splitlines() if line.strip())
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return {"git_commit": commit, "code_hash": digest(files), "dirty_files": dirty}
