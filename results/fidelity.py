"""Write results/FIDELITY.md — what hetfed reproduces of its three papers — from results/claims.yaml.

    python results/fidelity.py            # regenerate results/FIDELITY.md
    python results/fidelity.py --check    # exit 1 when FIDELITY.md is not what the claims and results give

Every number comes from a results folder's runs.csv (one value per seed, written by
`hetfed sweep`); the rules are in hetfed.analysis.fidelity.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hetfed.analysis.fidelity import render

HERE = Path(__file__).parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python results/fidelity.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when FIDELITY.md is stale, instead of writing it")
    args = ap.parse_args(argv)
    text = render(HERE, HERE / "claims.yaml")
    out = HERE / "FIDELITY.md"
    if args.check:
        if not out.is_file() or out.read_text() != text:
            print(f"{out} is stale: run python results/fidelity.py", file=sys.stderr)
            return 1
        return 0
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
