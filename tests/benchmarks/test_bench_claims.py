"""Paper orderings: verdicts from means and spreads, and the Markdown/PNG reports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedtune.benchmarks.claims import Claim, evaluate_claims
from fedtune.benchmarks.quality import summarize
from fedtune.benchmarks.report import is_png, plot_rounds, quality_markdown


def _runs(method: str, finals: list[float]) -> list[dict[str, Any]]:
    return [
        {
            "method": method,
            "kind": "algorithm",
            "seed": seed,
            "seconds": 1.0,
            "rounds": [
                {"round": 0.0, "em": 0.1, "local_em": 0.1, "test_loss": 2.0},
                {"round": 1.0, "em": value, "local_em": value, "test_loss": 1.0, "train_loss": 1.5},
            ],
        }
        for seed, value in enumerate(finals)
    ]


@pytest.mark.parametrize(
    ("better", "worse", "strict", "verdict"),
    [
        ([0.8, 0.82, 0.81], [0.5, 0.52, 0.51], True, "reproduces"),
        ([0.5, 0.52, 0.51], [0.8, 0.82, 0.81], True, "reversed"),
        ([0.5, 0.7, 0.6], [0.55, 0.65, 0.6], True, "within noise"),
        ([0.5, 0.7, 0.6], [0.55, 0.65, 0.6], False, "reproduces"),
        # ">=" with the mean behind, but by less than 2 s.e.: not reproduced, not reversed.
        ([0.5, 0.7, 0.58], [0.55, 0.65, 0.6], False, "within noise"),
        ([0.8], [0.5], True, "single seed"),
    ],
)
def test_verdicts(better: list[float], worse: list[float], strict: bool, verdict: str) -> None:
    table = summarize(_runs("a", better) + _runs("b", worse))
    (result,) = evaluate_claims(table, [Claim("a", "b", "paper", strict=strict)])
    assert result["verdict"] == verdict
    assert result["difference"] == pytest.approx(sum(better) / len(better) - sum(worse) / len(worse))


def test_claims_whose_methods_did_not_run_are_left_out() -> None:
    table = summarize(_runs("fedavg", [0.5, 0.6]))
    assert evaluate_claims(table, [Claim("fedavg", "fedbiot", "x")]) == []


def test_markdown_and_plots(tmp_path: Path) -> None:
    runs = _runs("fedavg", [0.6, 0.7]) + _runs("standalone", [0.3, 0.35])
    for run in runs:
        for row in run["rounds"]:
            row["em/reverse"] = row["em"]
    table = summarize(runs)
    results = {
        "spec": {"rounds": 1, "seeds": [0, 1]},
        "suite": {"test": {"records": 30}},
        "categories": ["reverse"],
        "runs": runs,
        "table": table,
        "claims": evaluate_claims(table),
    }
    text = quality_markdown(results)
    assert "| fedavg | 2 | 0.650 ± 0.071 |" in text
    assert "fedavg > standalone" in text and "reproduces" in text
    paths = plot_rounds(results, tmp_path)
    assert {p.name for p in paths} == {"em.png", "local_em.png", "test_loss.png", "train_loss.png"}
    assert all(is_png(p) for p in paths)
    (tmp_path / "fake.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    assert not is_png(tmp_path / "fake.png")


def _with_leakage(method: str, em: list[float], leakage: list[float]) -> list[dict[str, Any]]:
    runs = _runs(method, em)
    for run, value in zip(runs, leakage, strict=True):
        run["rounds"][-1]["leakage"] = value
    return runs


@pytest.mark.parametrize(
    ("mine", "theirs", "verdict"),
    [
        ([0.10, 0.12, 0.11], [0.50, 0.52, 0.51], "reproduces"),
        ([0.50, 0.52, 0.51], [0.10, 0.12, 0.11], "reversed"),
    ],
)
def test_leakage_claims_count_lower_as_better(
    mine: list[float], theirs: list[float], verdict: str
) -> None:
    table = summarize(
        _with_leakage("a", [0.5, 0.5, 0.5], mine) + _with_leakage("b", [0.5, 0.5, 0.5], theirs)
    )
    claim = Claim("a", "b", "paper", metric="leakage")
    (result,) = evaluate_claims(table, [claim])
    assert claim.text == "leakage: a < b"
    assert result["verdict"] == verdict and result["metric"] == "leakage"
    assert result["difference"] == pytest.approx(sum(mine) / 3 - sum(theirs) / 3)


def test_margin_and_equality_claims() -> None:
    table = summarize(
        _runs("a", [0.60, 0.61, 0.62])
        + _runs("b", [0.63, 0.64, 0.65])
        + _runs("c", [0.60, 0.61, 0.62])
    )
    close = Claim("a", "b", "paper", strict=False, margin=0.05)
    far = Claim("a", "b", "paper", strict=False, margin=0.0)
    same, other = Claim("a", "c", "paper", equal=True), Claim("a", "b", "paper", equal=True)
    verdicts = [r["verdict"] for r in evaluate_claims(table, [close, far, same, other])]
    assert verdicts == ["reproduces", "reversed", "reproduces", "differs"]
    assert close.text == "a >= b - 0.05" and same.text == "a == c"
