"""Copy requirements.txt's pins (except the test runner) into pyproject.toml's dependencies.

    python tools/sync_pins.py        # after adding a pin to requirements.txt

tests/test_envs.py fails while the two disagree; this keeps requirements.txt the one place to edit.
"""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST_ONLY = ("pytest",)


def main() -> None:
    reqs = [ln.strip() for ln in (ROOT / "requirements.txt").read_text().splitlines()
            if ln.strip() and not ln.startswith("#") and not ln.strip().startswith(TEST_ONLY)]
    path = ROOT / "pyproject.toml"
    text = path.read_text()
    i = text.index("dependencies = [")
    j = text.index("]", i)
    lines, line = [], " "
    for item in (f'"{r}",' for r in reqs):
        if len(line) + len(item) + 1 > 100:
            lines.append(line.rstrip())
            line = " "
        line += " " + item
    lines.append(line.rstrip())
    path.write_text(text[:i] + "dependencies = [\n" + "\n".join(lines) + "\n" + text[j:])
    print(f"pyproject.toml: {len(reqs)} pinned dependencies")


if __name__ == "__main__":
    main()
