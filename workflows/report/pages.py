# Pages for Snakemake's own report (`snakemake --report`): each method's claims and the verdict table
# as HTML, written from the claims.json files (reprozoo.report.write_claims_pages).
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parents[1] / "src"))  # noqa: F821

from reprozoo.report import write_claims_pages  # noqa: E402

write_claims_pages(list(snakemake.input.claims), list(snakemake.output.pages), snakemake.output.summary)  # noqa: F821
with open(snakemake.log[0], "w") as fh:  # noqa: F821
    fh.write(f"wrote {len(snakemake.output.pages)} claims page(s) and {snakemake.output.summary}\n")  # noqa: F821
