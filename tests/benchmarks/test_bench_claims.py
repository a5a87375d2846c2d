"""Paper orderings: paired differences over seeds, the verdict rule, and the Markdown/PNG
reports."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from fedtune.benchmarks.claims import PAPER_CLAIMS, Claim, evaluate_claims
from fedtune.benchmarks.paired import paired_difference
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
        # ">=" with equal means: the interval straddles 0, so not shown either way.
        ([0.5, 0.7, 0.6], [0.55, 0.65, 0.6], False, "within noise"),
        # Unpaired, these overlap (means 0.60 vs 0.58, spreads 0.1); paired by seed, every
        # seed gains 0.02 +- 0.001: the pairing is what makes the comparison decisive.
        ([0.5, 0.7, 0.6], [0.479, 0.681, 0.58], True, "reproduces"),
        ([0.8], [0.5], True, "single seed"),
    ],
)
def test_verdicts(better: list[float], worse: list[float], strict: bool, verdict: str) -> None:
    runs = _runs("a", better) + _runs("b", worse)
    (result,) = evaluate_claims(runs, [Claim("a", "b", "paper", strict=strict)])
    assert result["verdict"] == verdict
    assert result["difference"] == pytest.approx(sum(better) / len(better) - sum(worse) / len(worse))


def test_interval_matches_scipys_paired_t_test() -> None:
    """The interval against scipy's own paired t-test (an independent computation)."""
    from scipy.stats import ttest_rel

    a = [0.31, 0.27, 0.35, 0.30, 0.29]
    b = [0.25, 0.26, 0.28, 0.22, 0.27]
    paired = paired_difference(dict(enumerate(a)), dict(enumerate(b)))
    assert paired is not None
    reference = ttest_rel(a, b).confidence_interval(0.95)
    assert (paired.low, paired.high) == pytest.approx((reference.low, reference.high), abs=1e-12)
    assert paired.n == 5 and paired.mean == pytest.approx(0.048)


def test_interval_by_hand_for_two_seeds() -> None:
    """n = 2: d = (0.1, 0.3), mean 0.2, s = sqrt(0.02), t_{0.975,1} = 12.706."""
    paired = paired_difference({0: 0.6, 1: 0.8}, {0: 0.5, 1: 0.5})
    assert paired is not None
    half = 12.7062047364 * (0.02**0.5) / 2**0.5
    assert (paired.low, paired.high) == pytest.approx((0.2 - half, 0.2 + half), rel=1e-9)


def test_runs_pair_by_seed_not_by_order() -> None:
    runs = _runs("a", [0.5, 0.7, 0.6]) + _runs("b", [0.45, 0.65, 0.55])
    # The same runs listed in another order pair the same way.
    (forward,) = evaluate_claims(runs, [Claim("a", "b", "x")])
    (backward,) = evaluate_claims(list(reversed(runs)), [Claim("a", "b", "x")])
    assert forward == backward
    assert forward["low"] == pytest.approx(0.05) and forward["verdict"] == "reproduces"
    # Only the seeds both ran are paired; a deterministic run pairs with every seed.
    only_two = [r for r in runs if not (r["method"] == "b" and r["seed"] == 2)]
    (partial,) = evaluate_claims(only_two, [Claim("a", "b", "x")])
    assert partial["n"] == 2 and partial["seeds"] == [0, 1]
    fixed = _runs("z", [0.1])
    fixed[0]["seed"] = None
    (against_fixed,) = evaluate_claims(runs + fixed, [Claim("a", "z", "x")])
    assert against_fixed["n"] == 3 and against_fixed["difference"] == pytest.approx(0.5)


def test_every_claim_names_methods_that_exist() -> None:
    """claims.py holds claims of registered algorithms (or their variants) and baselines only."""
    from fedtune.algorithms.registry import algorithm_names
    from fedtune.benchmarks.methods import parse_method
    from fedtune.benchmarks.quality import BASELINES, EXTRA_BASELINES

    known = set(algorithm_names()) | set(BASELINES) | set(EXTRA_BASELINES)
    for claim in PAPER_CLAIMS:
        for method in (claim.better, claim.worse):
            assert parse_method(method).algorithm in known, (claim.text, method)


def test_claims_whose_methods_did_not_run_are_left_out() -> None:
    assert evaluate_claims(_runs("fedavg", [0.5, 0.6]), [Claim("fedavg", "fedbiot", "x")]) == []


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
        "claims": evaluate_claims(runs),
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
    runs = _with_leakage("a", [0.5, 0.5, 0.5], mine) + _with_leakage("b", [0.5, 0.5, 0.5], theirs)
    claim = Claim("a", "b", "paper", metric="leakage")
    (result,) = evaluate_claims(runs, [claim])
    assert claim.text == "leakage: a < b"
    assert result["verdict"] == verdict and result["metric"] == "leakage"
    assert result["difference"] == pytest.approx(sum(mine) / 3 - sum(theirs) / 3)


def test_margin_and_equality_claims() -> None:
    runs = (
        _runs("a", [0.60, 0.61, 0.62])
        + _runs("b", [0.63, 0.64, 0.65])
        + _runs("c", [0.60, 0.61, 0.62])
    )
    close = Claim("a", "b", "paper", strict=False, margin=0.05)
    far = Claim("a", "b", "paper", strict=False, margin=0.0)
    same, other = Claim("a", "c", "paper", equal=True), Claim("a", "b", "paper", equal=True)
    verdicts = [r["verdict"] for r in evaluate_claims(runs, [close, far, same, other])]
    assert verdicts == ["reproduces", "reversed", "reproduces", "differs"]
    assert close.text == "a >= b - 0.05" and same.text == "a == c"


def test_the_summary_names_every_paper_a_claim_cites() -> None:
    """The page's paper column keeps each paper a claim's source names before its text
    (``FedMKT, FedIT: ...`` is both papers' claim, not FedMKT's alone)."""
    from fedtune.benchmarks.claims_page import _paper

    papers = {claim.source.split()[0].strip(",:") for claim in PAPER_CLAIMS}
    for claim in PAPER_CLAIMS:
        cited = claim.source.split(":", 1)[0].split("(", 1)[0]
        named = {p for p in papers if re.search(rf"\b{re.escape(p)}\b", cited)}
        column = _paper(claim.source)
        assert named and {p.strip() for p in column.split(",")} == named, (claim.source, column)
