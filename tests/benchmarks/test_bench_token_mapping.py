"""``fedtune bench token-mapping``: FedMKT's mapping figures across four tokenizer families."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedtune.benchmarks.token_mapping import FAMILIES
from fedtune.cli.main import main


@pytest.mark.slow
def test_the_token_mapping_bench_records_every_pair_and_regenerates_its_block(tmp_path: Path) -> None:
    page = tmp_path / "docs" / "benchmarks.md"
    page.parent.mkdir()
    page.write_text("<!-- generated: tokenmap docs/results/tm.json -->\n<!-- end generated -->\n")
    assert main(["bench", "token-mapping", "--record", str(tmp_path / "docs" / "results" / "tm.json")]) == 0
    results = json.loads((tmp_path / "docs" / "results" / "tm.json").read_text())
    assert results["commit"] and results["device"]["description"]
    pairs = {(p["src"], p["dst"]): p for p in results["pairs"]}
    assert set(pairs) == {(s, d) for s in FAMILIES for d in FAMILIES}
    assert all(pairs[(f, f)]["identity"] == 1.0 for f in FAMILIES)
    assert all(p["word_to_fragment_or_special"] == 0 and p["exact_kept"] == p["exact_matches"] > 0
               for p in pairs.values())
    assert "| minilm-wordpiece -> builtin |" in page.read_text()
