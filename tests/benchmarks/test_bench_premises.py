"""Premises: measured from the runs, printed above the table, and no verdict where false.

The verdict property is checked for every claim of the registry that rests on a premise,
each with runs where its premise holds, fails and is not recorded."""

from __future__ import annotations

from typing import Any

import pytest

from fedtune.benchmarks.claims import LOWER_IS_BETTER, PAPER_CLAIMS, Claim, evaluate_claims
from fedtune.benchmarks.premises import (
    LARGE_KNOWS_MORE,
    MIN_LARGE_EM,
    MIN_TEACH_EM,
    SMALL_CANNOT_EM,
    SYNTHETIC_USED,
    TENANTS_TEACH,
    measure,
    premise_of,
)
from fedtune.benchmarks.quality import summarize
from fedtune.benchmarks.report import quality_markdown

Runs = dict[tuple[str, int | None], dict[str, Any]]
GAINS = (0.10, 0.11, 0.12, 0.10, 0.11)  # per seed: every interval clearly above 0
PREMISED = [c for c in PAPER_CLAIMS if c.premises]
# What always giving each category's most common answer scores on the runs' test set.
CONSTANT = {"arithmetic": 0.05, "count": 0.3}
UNPREMISED = [c for c in PAPER_CLAIMS if not c.premises]
# The categories the runs' public set holds records of.
PUBLIC = ("arithmetic", "count")


def _run(runs: Runs, method: str, seed: int | None, rounds: int = 2) -> dict[str, Any]:
    return runs.setdefault(
        (method, seed),
        {
            "method": method,
            "kind": "algorithm",
            "seed": seed,
            "seconds": 1.0,
            "rounds": [{"round": float(r)} for r in range(rounds)],
        },
    )


def _zero_shot(runs: Runs, large: float, large_arithmetic: float, small: float = 0.1) -> None:
    """Zero-shot runs of the large model and round 0 of the small one's: small cannot do
    arithmetic (0.0, below the constant answer's 0.05), does count better than large."""
    (zero,) = _run(runs, "zero-shot", None, rounds=1)["rounds"]
    zero.update({"em": large, "llm/em": large, "slm/em": small})
    zero.update({"em/arithmetic": large_arithmetic, "em/count": 0.1})
    for seed in range(len(GAINS)):
        first = _run(runs, "fedavg-small", seed)["rounds"][0]
        first.update({"em": small, "em/arithmetic": 0.0, "em/count": 0.2})


def _tenants_own(runs: Runs, count: float) -> None:
    """The tenants' own trained models (standalone-small): ``count`` EM in count, where the
    zero-shot LLM scores 0.1, and none in arithmetic."""
    for seed in range(len(GAINS)):
        last = _run(runs, "standalone-small", seed)["rounds"][-1]
        last.update({"slm/category_em/count": count, "slm/category_em/arithmetic": 0.0})


def _synthetic(runs: Runs, steps_with_synthetic: int) -> None:
    for run in runs.values():
        if premise_of(run["method"]) == SYNTHETIC_USED:
            # Ten client steps per round, the first ``steps_with_synthetic`` trained on 3.
            run["synthesis_steps"] = [
                {"round": row["round"], "tenant": f"t{i}", "used": 3 if i < steps_with_synthetic else 0}
                for row in run["rounds"]
                for i in range(10)
            ]


def _claim_runs(claim: Claim, premise: str) -> list[dict[str, Any]]:
    """Runs where ``claim``'s interval says ``reproduces``, with its premises ``premise``
    (``holds``, ``fails`` or ``absent``)."""
    runs: Runs = {}
    if premise != "absent":
        _zero_shot(runs, 0.5, 0.9) if premise == "holds" else _zero_shot(runs, 0.2, 0.3)
    lower = claim.metric in LOWER_IS_BETTER
    for seed, gain in enumerate(GAINS):
        worse = runs.get((claim.worse, None)) or _run(runs, claim.worse, seed)
        base = worse["rounds"][-1].setdefault(claim.metric, 0.3)
        delta = 0.0 if claim.equal else gain + claim.margin
        _run(runs, claim.better, seed)["rounds"][-1][claim.metric] = base - delta if lower else base + delta
    if premise != "absent":
        _synthetic(runs, 8 if premise == "holds" else 2)
        _tenants_own(runs, 0.1 + MIN_TEACH_EM if premise == "holds" else 0.1)
    return list(runs.values())


@pytest.mark.parametrize("claim", PREMISED, ids=lambda c: f"{c.text} [{c.source[:20]}]")
def test_a_claim_gets_a_verdict_only_where_its_premise_holds(claim: Claim) -> None:
    (held,) = evaluate_claims(_claim_runs(claim, "holds"), [claim], constant_em=CONSTANT, public_categories=PUBLIC)
    assert held["verdict"] == held["interval_verdict"] == "reproduces"
    assert set(held["premises"].values()) == {"holds"}

    (false,) = evaluate_claims(_claim_runs(claim, "fails"), [claim], constant_em=CONSTANT, public_categories=PUBLIC)
    assert false["verdict"].startswith("no verdict: premise false (")
    assert false["interval_verdict"] == "reproduces"
    # The interval is still reported, the same as where the premise holds.
    assert (false["low"], false["high"]) == pytest.approx((held["low"], held["high"]))
    # 5 seeds x 2 rounds x 10 client steps of the one FewFedPIT method, 2 of 10 with synthetic.
    expected = {
        LARGE_KNOWS_MORE: "(large zero-shot EM 0.200 vs small 0.100",
        SYNTHETIC_USED: "(20 of 100 client steps used",
        TENANTS_TEACH: "the tenants' models beat the LLM in no category",
    }
    for name in claim.premises:
        assert expected[name] in false["verdict"]

    (unknown,) = evaluate_claims(_claim_runs(claim, "absent"), [claim], constant_em=CONSTANT, public_categories=PUBLIC)
    assert unknown["verdict"] == "no verdict: premise not measured"
    assert (unknown["low"], unknown["high"]) == pytest.approx((held["low"], held["high"]))


@pytest.mark.parametrize("claim", UNPREMISED, ids=lambda c: f"{c.text} [{c.source[:20]}]")
def test_a_claim_resting_on_no_premise_ignores_them(claim: Claim) -> None:
    (result,) = evaluate_claims(_claim_runs(claim, "fails"), [claim], constant_em=CONSTANT, public_categories=PUBLIC)
    assert result["verdict"] == result["interval_verdict"] == "reproduces"
    assert result["premises"] == {}


def test_the_papers_that_assume_a_setting_have_claims_resting_on_it() -> None:
    sources = {name: {c.source.split(" ")[0] for c in PAPER_CLAIMS if name in c.premises}
               for name in (LARGE_KNOWS_MORE, SYNTHETIC_USED, TENANTS_TEACH)}
    assert sources == {
        LARGE_KNOWS_MORE: {"FedPT", "FedMKT"}, SYNTHETIC_USED: {"FewFedPIT"}, TENANTS_TEACH: {"FedMKT"},
    }
    # Only FedMKT's LLM-side claims rest on what the tenants teach; its SLM-side ones do not.
    assert {c.metric for c in PAPER_CLAIMS if TENANTS_TEACH in c.premises} == {"llm/em"}
    # beta = 1 uploads the private parameters bit for bit: no synthetic data involved.
    assert premise_of("fewfedpit@beta=1") is None and premise_of("fewfedpit") == SYNTHETIC_USED


@pytest.mark.parametrize(
    ("large", "arithmetic", "small", "status"),
    [
        # both bars met exactly: the large model MIN_LARGE_EM above the constant answer
        (MIN_LARGE_EM, CONSTANT["arithmetic"] + MIN_LARGE_EM, MIN_LARGE_EM / 2, "holds"),
        (MIN_LARGE_EM - 0.01, 0.9, 0.05, "fails"),  # below 0.25
        (0.5, 0.9, 0.26, "fails"),  # less than twice small's
        (0.5, MIN_LARGE_EM - 0.01, 0.1, "fails"),  # no category small cannot do and large can
        # over 0.25 in the category, but not 0.25 above what a constant answer scores
        (0.5, CONSTANT["arithmetic"] + MIN_LARGE_EM - 0.01, 0.1, "fails"),
    ],
)
def test_large_knows_more(large: float, arithmetic: float, small: float, status: str) -> None:
    runs: Runs = {}
    _zero_shot(runs, large, arithmetic, small)
    premise = measure(list(runs.values()), constant_em=CONSTANT)[LARGE_KNOWS_MORE]
    assert premise.status == status, premise.detail
    assert f"large zero-shot EM {large:.3f} vs small {small:.3f}" in premise.numbers
    assert f"arithmetic {arithmetic:.2f} vs 0.00 ({CONSTANT['arithmetic']:.2f})" in premise.detail


@pytest.mark.parametrize("small_above_constant", [0.0, SMALL_CANNOT_EM, SMALL_CANNOT_EM + 0.01])
def test_a_small_model_no_better_than_a_constant_answer_cannot_do_the_category(
    small_above_constant: float,
) -> None:
    """Where a constant answer scores well (count: 0.3 here), a small model at that level has
    no skill, however high its EM; a hair more than SMALL_CANNOT_EM above it has some."""
    runs: Runs = {}
    _zero_shot(runs, 0.8, 0.0)  # the large model cannot do arithmetic: count must decide
    runs[("zero-shot", None)]["rounds"][0]["em/count"] = CONSTANT["count"] + MIN_LARGE_EM
    for run in runs.values():
        if run["method"] == "fedavg-small":
            run["rounds"][0]["em/count"] = CONSTANT["count"] + small_above_constant
    premise = measure(list(runs.values()), constant_em=CONSTANT)[LARGE_KNOWS_MORE]
    expected = "holds" if small_above_constant <= SMALL_CANNOT_EM else "fails"
    assert premise.status == expected, premise.detail


def test_a_constant_answer_never_makes_the_large_model_know_a_category() -> None:
    """The general rule, over every category of the real task generator: a large model that
    always gives each category's most common answer scores exactly the constant answer's
    EM, and no category counts as one it can do, however poor the small model."""
    from fedtune.benchmarks.suite import constant_answer_em
    from fedtune.data.synthetic import CATEGORIES, generate

    records = generate(30, seed=5)
    constant = constant_answer_em(records)
    assert set(constant) == set(CATEGORIES)
    runs: Runs = {}
    (zero,) = _run(runs, "zero-shot", None, rounds=1)["rounds"]
    zero.update({"em": 0.6, "llm/em": 0.6, "slm/em": 0.0})
    zero.update({f"em/{c}": em for c, em in constant.items()})
    first = _run(runs, "fedavg-small", 0)["rounds"][0]
    first.update({"em": 0.0, **{f"em/{c}": 0.0 for c in CATEGORIES}})
    premise = measure(list(runs.values()), constant_em=constant)[LARGE_KNOWS_MORE]
    assert premise.status == "fails" and "can (≥ 0.25 above it): none" in premise.detail


def test_the_constant_answer_em_is_the_best_single_answer() -> None:
    """Checked against trying every answer as the constant one (an independent count)."""
    from fedtune.benchmarks.suite import constant_answer_em
    from fedtune.data.synthetic import generate

    records = generate(40, seed=9)
    for category, em in constant_answer_em(records).items():
        own = [r["response"] for r in records if r["category"] == category]
        best = max(sum(answer == given for given in own) / len(own) for answer in set(own))
        assert em == pytest.approx(best)


def test_without_the_constant_answers_no_category_is_read() -> None:
    runs: Runs = {}
    _zero_shot(runs, 0.5, 0.9)
    premise = measure(list(runs.values()))[LARGE_KNOWS_MORE]
    assert premise.status == "not measured"
    assert "constant answer's EM is not recorded" in premise.detail


def test_large_knows_more_without_the_small_models_categories_is_not_measured() -> None:
    runs: Runs = {}
    _zero_shot(runs, 0.5, 0.9)
    kept = [r for r in runs.values() if r["method"] == "zero-shot"]
    assert measure(kept, constant_em=CONSTANT)[LARGE_KNOWS_MORE].status == "not measured"
    no_zero_shot = [r for r in runs.values() if r["method"] != "zero-shot"]
    premise = measure(no_zero_shot, constant_em=CONSTANT)[LARGE_KNOWS_MORE]
    assert premise.status == "not measured" and "large" in premise.detail


@pytest.mark.parametrize(("with_synthetic", "status"), [(6, "holds"), (5, "fails"), (0, "fails")])
def test_synthetic_data_used_by_most_client_steps(with_synthetic: int, status: str) -> None:
    runs: Runs = {}
    for method in ("fewfedpit@beta=0", "fewfedpit@beta=0.5", "fewfedpit@beta=1", "fedavg"):
        _run(runs, method, 0)
    _synthetic(runs, with_synthetic)
    premise = measure(list(runs.values()))[SYNTHETIC_USED]
    assert premise.status == status
    # Two runs (beta < 1) of two rounds of 10 client steps: beta = 1 synthesizes nothing.
    assert premise.numbers == f"{4 * with_synthetic} of 40 client steps used ≥ 1 synthetic example"
    del runs[("fewfedpit@beta=0", 0)]["synthesis_steps"]  # one run that does not record it
    assert measure(list(runs.values()))[SYNTHETIC_USED].status == "not measured"


def _failing_markdown(claim: Claim, suite: dict[str, Any]) -> str:
    """The quality Markdown of runs where ``claim``'s premises fail, on ``suite``."""
    runs = _claim_runs(claim, "fails")
    for run in runs:
        for row in run["rounds"]:
            row.setdefault("em", 0.3)
            row.update({"local_em": row["em"], "test_loss": 1.0, "em/arithmetic": row["em"]})
    results = {
        "spec": {"rounds": 1, "seeds": list(range(len(GAINS)))},
        "suite": suite,
        "categories": ["arithmetic"],
        "runs": runs,
        "table": summarize(runs),
    }
    return quality_markdown(results)


def test_the_premise_is_printed_above_the_table_with_its_numbers() -> None:
    claim = next(c for c in PAPER_CLAIMS if c.better == "fedpt" and c.worse == "fedavg-small")
    text = _failing_markdown(claim, {"test": {"records": 30, "constant_answer_em": CONSTANT}})
    premise = text.index("Premise (large model knows more): **fails**. Large zero-shot EM 0.200 vs small 0.100")
    assert premise < text.index("| method |")
    assert "| no verdict: premise false (large zero-shot EM 0.200 vs small 0.100) |" in text


@pytest.mark.parametrize(("slms_above_constant", "status"), [((0.0, 0.1), "holds"), ((0.1, 0.1), "fails")])
def test_heterogeneous_small_models_are_read_per_category_by_their_mean(
    slms_above_constant: tuple[float, float], status: str
) -> None:
    """FedMKT's heterogeneous tenants have no shared small model to train (no fedavg-small):
    the zero-shot run's per-category mean over their own models is the small side, recorded
    by the quality benchmark and read here; each tenant's ``slm/em/<tenant>`` is not."""
    from fedtune.benchmarks.quality import _tenant_means

    per_tenant = {
        f"t{i}": {"em": 0.1, "test_loss": 1.0, "em/arithmetic": CONSTANT["arithmetic"] + above}
        for i, above in enumerate(slms_above_constant)
    }
    shares = {t: {"arithmetic": 1.0} for t in per_tenant}
    slm = _tenant_means(per_tenant, shares)
    mean = CONSTANT["arithmetic"] + sum(slms_above_constant) / len(slms_above_constant)
    assert slm["slm/category_em/arithmetic"] == pytest.approx(mean)
    runs: Runs = {}
    (zero,) = _run(runs, "zero-shot", None, rounds=1)["rounds"]
    zero.update({"em": 0.6, "llm/em": 0.6, "em/arithmetic": 0.9, **slm})
    premise = measure(list(runs.values()), constant_em=CONSTANT)[LARGE_KNOWS_MORE]
    assert premise.status == status, premise.detail
    assert f"arithmetic 0.90 vs {mean:.2f}" in premise.detail
    assert "t0" not in premise.detail


def _teach_runs(llm: dict[str, float], tenants: list[dict[str, float]]) -> list[dict[str, Any]]:
    """A zero-shot LLM with ``llm`` EM per category, and standalone-small seeds whose final
    rounds give the tenants' models ``tenants[seed]`` per category."""
    runs: Runs = {}
    (zero,) = _run(runs, "zero-shot", None, rounds=1)["rounds"]
    zero.update({"em": 0.5, "llm/em": 0.5, **{f"em/{c}": v for c, v in llm.items()}})
    for seed, own in enumerate(tenants):
        last = _run(runs, "standalone-small", seed)["rounds"][-1]
        last.update({f"slm/category_em/{c}": v for c, v in own.items()})
    return list(runs.values())


CATEGORIES = ("arithmetic", "classify", "count", "lookup", "reverse")


@pytest.mark.parametrize("category", CATEGORIES)
@pytest.mark.parametrize("in_public", [True, False])
@pytest.mark.parametrize(("above", "beats"), [(MIN_TEACH_EM, True), (MIN_TEACH_EM - 0.01, False)])
def test_tenants_teach_only_where_they_beat_the_llm_in_a_category_of_the_public_set(
    category: str, in_public: bool, above: float, beats: bool
) -> None:
    """For every category: the premise holds exactly when the tenants' own models beat the
    zero-shot LLM there by MIN_TEACH_EM (mean over seeds) and the public set holds it."""
    llm = dict.fromkeys(CATEGORIES, 0.4)
    # Two seeds whose mean is ``above`` over the LLM; every other category below it.
    tenants = [
        {**dict.fromkeys(CATEGORIES, 0.2), category: 0.4 + above + delta} for delta in (-0.02, 0.02)
    ]
    public = [c for c in CATEGORIES if c != category or in_public]
    premise = measure(_teach_runs(llm, tenants), [TENANTS_TEACH], public_categories=public)[TENANTS_TEACH]
    assert premise.status == ("holds" if beats and in_public else "fails"), premise.detail
    if beats and not in_public:
        assert premise.numbers == f"tenants beat the LLM only on {category}, which the public set lacks"
        assert f"{category} {0.4 + above:.2f} vs 0.40 (not in the public set)" in premise.detail
    if not beats:
        assert premise.numbers == "the tenants' models beat the LLM in no category"


def test_tenants_teach_is_not_measured_without_the_public_set_or_the_tenants_own_models() -> None:
    runs = _teach_runs({"count": 0.0}, [{"count": 0.5}])
    assert measure(runs, [TENANTS_TEACH])[TENANTS_TEACH].status == "not measured"
    no_own = _teach_runs({"count": 0.0}, [])
    premise = measure(no_own, [TENANTS_TEACH], public_categories=["count"])[TENANTS_TEACH]
    assert premise.status == "not measured"
    assert "standalone-small" in premise.detail


def test_the_public_sets_categories_are_those_it_holds_records_of() -> None:
    from fedtune.benchmarks.suite import recorded_public_categories

    counts = {"arithmetic": 270, "count": 0, "lookup": 180}
    results = {"suite": {"public": {"category_counts": counts, "records": 450}}}
    assert recorded_public_categories(results) == ["arithmetic", "lookup"]
    assert recorded_public_categories({"suite": {}}) is None
    assert recorded_public_categories({}) is None


def test_fedmkts_llm_side_premise_is_printed_above_the_table() -> None:
    claim = next(c for c in PAPER_CLAIMS if c.better == "fedmkt" and c.metric == "llm/em")
    text = _failing_markdown(claim, {
        "test": {"records": 30, "constant_answer_em": CONSTANT},
        "public": {"category_counts": {"arithmetic": 10, "count": 5}, "records": 15},
    })
    line = text.index(f"Premise ({TENANTS_TEACH}): **fails**. The tenants' models beat the LLM in no category")
    assert line < text.index("| method |")
    assert "no verdict: premise false (" in text
