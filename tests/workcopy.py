"""A copy of the workflow (Snakefile, rule files, envs, config, profiles, package) in a temporary
folder, so that a test's pipeline runs, edits and kills never touch the checkout's results."""
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ("Snakefile", "workflows", "envs", "config", "profiles", "src")


def copy_workflow(dest: Path, extra: tuple[str, ...] = ()) -> Path:
    """Copy the workflow's files (and ``extra`` top-level paths that exist) into ``dest``."""
    dest = Path(dest)
    for name in WORKFLOW + tuple(extra):
        src = ROOT / name
        if src.exists():
            (shutil.copytree if src.is_dir() else shutil.copy)(src, dest / name)
    return dest
