"""Merge ``fedtune bench quality`` results run one seed per process into one document.

    python scripts/merge_quality.py PART.json [PART.json ...] --out docs/results/NAME.json

On a machine with cores to spare (or shared by others, where each process gets its own share),
``--seeds 0``, ``--seeds 1`` ... in separate workspaces copies run side by side; this pools
their runs, recomputes the table and the claims, and prints the Markdown that
``fedtune.benchmarks.report.quality_markdown`` generates from the merged document.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedtune.benchmarks.quality import merge_results
from fedtune.benchmarks.report import quality_markdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    merged = merge_results([json.loads(p.read_text(encoding="utf-8")) for p in args.parts])
    args.out.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(quality_markdown(merged))


if __name__ == "__main__":
    main()
