"""``fedtune bench quality --comparison dp``: utility and leakage against epsilon (CI preset)."""

from __future__ import annotations

import json
from pathlib import Path

import dp_accounting
import pytest
from dp_accounting.rdp import RdpAccountant

from fedtune.benchmarks.methods import parse_method
from fedtune.cli.main import main


def test_the_dp_comparison_reports_epsilon_and_leakage_per_method(ci_workspace: Path) -> None:
    page = ci_workspace / "docs" / "benchmarks.md"  # --record regenerates the page's block
    page.parent.mkdir()
    page.write_text("<!-- generated: quality docs/results/dp.json -->\n<!-- end generated -->\n")
    assert main(["bench", "quality", "--out", str(ci_workspace), "--preset", "ci", "--comparison", "dp",
                 "--record", str(ci_workspace / "docs" / "results" / "dp.json")]) == 0
    results = json.loads((ci_workspace / "quality" / "results.json").read_text())
    assert json.loads((ci_workspace / "docs" / "results" / "dp.json").read_text()) == results
    assert "| epsilon |" in page.read_text()
    assert results["commit"]  # the source the numbers came from
    rows = {row["method"]: row["metrics"] for row in results["table"]}
    assert set(rows) == {"zero-shot", "fedavg@aggregation_weights=uniform", "fedavg@dp.noise_multiplier=1"}
    assert "dp/epsilon" not in rows["fedavg@aggregation_weights=uniform"]
    # The CI suite's three tenants every round, two rounds: the Gaussian mechanism twice.
    accountant = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    accountant.compose(dp_accounting.GaussianDpEvent(1.0), 2)
    assert rows["fedavg@dp.noise_multiplier=1"]["dp/epsilon"]["mean"] == pytest.approx(accountant.get_epsilon(1e-5))
    assert "leakage" in rows["fedavg@dp.noise_multiplier=1"]
    markdown = (ci_workspace / "quality" / "results.md").read_text()
    assert "| epsilon |" in markdown and "no DP" in markdown and "DP-FedAvg rows: clipping" in markdown


def test_dp_settings_of_a_label_go_to_the_privacy_section_with_uniform_weights() -> None:
    method = parse_method("fedavg@dp.noise_multiplier=0.5@dp.placement=distributed")
    assert method.privacy == {"noise_multiplier": 0.5, "placement": "distributed"}
    assert method.params == {"aggregation_weights": "uniform"}


def test_a_bad_dp_setting_fails_before_any_run(ci_workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["bench", "quality", "--out", str(ci_workspace), "--preset", "ci", "--comparison", "dp",
         "--algorithms", "fedavg@dp.noise_multiplier=-1"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "fedavg@dp.noise_multiplier=-1" in err and "noise_multiplier" in err
