"""The DP table in docs/benchmarks.md is exactly what the report generator makes of its results."""

from __future__ import annotations

import json
from pathlib import Path

from fedtune.benchmarks.report import quality_markdown

ROOT = Path(__file__).resolve().parents[2]
BEGIN = "<!-- generated from docs/results/dp-quality.json: begin -->\n"
END = "\n<!-- generated from docs/results/dp-quality.json: end -->"


def test_regenerating_the_dp_table_changes_nothing() -> None:
    results = json.loads((ROOT / "docs" / "results" / "dp-quality.json").read_text())
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    shown = text[text.index(BEGIN) + len(BEGIN) : text.index(END)]
    assert shown == quality_markdown(results).rstrip("\n")
    assert f"commit {results['commit']}" in text  # the text names the commit the numbers came from
