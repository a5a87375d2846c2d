"""The tables in docs/benchmarks.md are generated from docs/results/*.json: regenerating each
one from its JSON must give text that the document already holds, character for character."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from fedtune.benchmarks.report import mined_markdown, quality_markdown, system_markdown

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
# Each results file and the generator of its tables.
GENERATORS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "fedmkt-quality.json": quality_markdown,
    "fedmkt-hetero-quality.json": quality_markdown,
    "fedmkt-mined.json": mined_markdown,
    "fedpt-alpha.json": quality_markdown,
    "fedpt-quality.json": quality_markdown,
    "fewfedpit-quality.json": quality_markdown,
    "peer-system.json": system_markdown,
}


def test_every_results_file_has_a_generator() -> None:
    assert sorted(p.name for p in RESULTS.glob("*.json")) == sorted(
        name for name in GENERATORS if (RESULTS / name).exists()
    )


@pytest.mark.parametrize("name", sorted(n for n in GENERATORS if (RESULTS / n).exists()))
def test_regenerating_a_table_changes_nothing(name: str) -> None:
    results = json.loads((RESULTS / name).read_text(encoding="utf-8"))
    document = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert GENERATORS[name](results) in document, (
        f"docs/benchmarks.md does not hold the tables generated from docs/results/{name}; "
        "paste the generator's output instead of editing the tables by hand"
    )
