# One script for every rule: the rule's name picks the stage (see reprozoo.stages).
# The package is imported from this checkout, so jobs run the same code in any environment
# (the project venv, a conda env from envs/, a SLURM node on a shared filesystem).
import os
import sys
from pathlib import Path

# BLAS/OpenMP pools sized to the job's threads before numpy/torch load: parallel jobs on a small
# machine otherwise oversubscribe the cores (tiny matrix work then runs several times slower)
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(max(1, int(snakemake.threads)))  # noqa: F821
sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parents[1] / "src"))  # noqa: F821

from reprozoo.stages import from_snakemake  # noqa: E402

from_snakemake(snakemake)  # noqa: F821 - injected by Snakemake
