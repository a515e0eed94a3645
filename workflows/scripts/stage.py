# One script for every rule: the rule's name picks the stage (see reprozoo.stages).
from reprozoo.stages import from_snakemake

from_snakemake(snakemake)  # noqa: F821 - injected by Snakemake
