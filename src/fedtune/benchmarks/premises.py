"""The premises some papers' claims rest on, measured from a quality benchmark's runs.

A comparison says something about a method only where the setting the paper assumes holds
on the suite; where it does not, :func:`fedtune.benchmarks.claims.evaluate_claims` draws no
verdict, and each table prints its premise with the numbers above it.

- **The large model knows clearly more than the small ones** (FedPT, paper 002; FedMKT,
  paper 003: both transfer the large model's knowledge). Holds when the large model's
  zero-shot EM is at least :data:`MIN_LARGE_EM` and at least :data:`MIN_RATIO` times the
  small one's, with at least one category the small model cannot do and the large one can.
  Both are read as skill: EM above the constant answer's in that category (the share of its
  most common reference answer, :func:`fedtune.benchmarks.suite.constant_answer_em`), since
  a model that always answers "fruit" gets 0.47 on the default test set's classify. The
  small model cannot do a category when its EM is at most :data:`SMALL_CANNOT_EM` above the
  constant answer's; the large one can when its EM is at least :data:`MIN_LARGE_EM` above.
- **The tenants teach the LLM something, on public data** (FedMKT, paper 003, Section 3:
  the LLM learns from the tenants' models only through their knowledge on the public set).
  The LLM-side claims (``llm/em``) need the tenants' own models to know something the LLM
  does not, in a category the public set holds records of: there, the tenants' trained small
  models (``standalone-small``'s final round, ``slm/category_em/<category>``, mean over
  seeds) must score at least :data:`MIN_TEACH_EM` above the LLM's zero-shot EM. Where they
  beat it only in categories the public set lacks, nothing the LLM could learn crosses.
- **Synthetic data is used** (FewFedPIT, paper 004: its privacy and utility come from the
  public parameters trained on synthetic data). Holds when more than :data:`MIN_SYNTHETIC_SHARE`
  of the client steps of its runs (beta < 1) used at least one synthetic example.

Reading the runs (every run's first record is round 0, the model before any training):
the large model's zero-shot is the ``zero-shot`` run (``llm/em`` where the LLM is named,
else ``em``; ``em/<category>``); the small model's is the ``zero-shot`` run's ``slm/em``, else
the round-0 ``small/em`` of a run that records its small model (FedPT), else the round-0
``em`` of a run training the small model (``fedavg-small``, ``standalone-small``). Per
category, the small side is the zero-shot run's ``slm/category_em/<category>`` (the mean over
the tenants' small models where each has its own: a category counts as one the small ones
cannot do when they cannot on average), else that training run's round-0 ``em/<category>``.
Synthetic data: each FewFedPIT run's ``synthesis_steps`` (one entry per client step,
:mod:`fedtune.benchmarks.synthesis_steps`), whose ``used`` counts the synthetic examples that
step trained on.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from fedtune.algorithms.fewfedpit.config import FewFedPITConfig
from fedtune.benchmarks.methods import parse_method

__all__ = [
    "LARGE_KNOWS_MORE",
    "MIN_LARGE_EM",
    "MIN_RATIO",
    "MIN_SYNTHETIC_SHARE",
    "MIN_TEACH_EM",
    "SMALL_CANNOT_EM",
    "SYNTHETIC_USED",
    "TENANTS_TEACH",
    "Premise",
    "measure",
    "premise_lines",
    "premise_of",
    "premises_of",
]

LARGE_KNOWS_MORE: Final = "large model knows more"
SYNTHETIC_USED: Final = "synthetic data used"
TENANTS_TEACH: Final = "tenants know what the LLM does not, on public data"
#: The large model's zero-shot EM must reach this overall, and be this far above the
#: constant answer's in a category small cannot do.
MIN_LARGE_EM: Final = 0.25
#: ... and be at least this many times the small model's.
MIN_RATIO: Final = 2.0
#: A category the small model "cannot do": its zero-shot EM there is at most this above the
#: constant answer's.
SMALL_CANNOT_EM: Final = 0.05
#: The tenants' trained models beat the LLM's zero-shot EM by at least this in some category
#: of the public set.
MIN_TEACH_EM: Final = 0.05
#: "Most client steps": more than this share used at least one synthetic example.
MIN_SYNTHETIC_SHARE: Final = 0.5

#: The algorithms whose claims rest on a premise (a method label's algorithm, before any
#: ``@FIELD=VALUE``: :func:`fedtune.benchmarks.methods.parse_method`).
_FAMILY_PREMISE: Final[dict[str, str]] = {
    "fedpt": LARGE_KNOWS_MORE,
    "fedavg-pt": LARGE_KNOWS_MORE,
    "fedmkt": LARGE_KNOWS_MORE,
    "fewfedpit": SYNTHETIC_USED,
}
#: Premises that only claims on one metric of an algorithm rest on (the algorithm, the metric).
_METRIC_PREMISE: Final[dict[tuple[str, str], str]] = {("fedmkt", "llm/em"): TENANTS_TEACH}
_SMALL_RUNS: Final = ("fedavg-small", "standalone-small")
# What the tenants' data teaches their own models, without the LLM.
_TENANTS_OWN: Final = "standalone-small"
# The zero-shot run's small models' mean EM per category (quality._category_means).
_SMALL_CATEGORY: Final = "slm/category_em/"

Status = Literal["holds", "fails", "not measured"]


@dataclass(frozen=True)
class _Suite:
    """What the premises read about the suite besides the runs: the test set's constant-answer
    EM per category and the categories the public set holds records of (None: not recorded)."""

    constant_em: Mapping[str, float] | None
    public_categories: Collection[str] | None


@dataclass(frozen=True)
class Premise:
    """A premise as measured: ``status``, ``numbers`` (the deciding ones, short, for a
    verdict) and ``detail`` (everything, for the line above the table)."""

    name: str
    status: Status
    numbers: str
    detail: str

    @property
    def line(self) -> str:
        """``Premise (large model knows more): **fails**. ...``, printed above the table."""
        return f"Premise ({self.name}): **{self.status}**. {self.detail[:1].upper()}{self.detail[1:]}"


def premise_of(method: str) -> str | None:
    """The premise a claim about ``method`` (a run's label) rests on, or None.

    FewFedPIT at beta = 1 uploads the private parameters bit for bit (paper 004, Algorithm
    1, line 9): no synthetic data is involved, so its claims rest on none."""
    parsed = parse_method(method)
    if parsed.algorithm == "fewfedpit":
        beta = parsed.params.get("beta", FewFedPITConfig.model_fields["beta"].default)
        if float(beta) == 1.0:
            return None
    return _FAMILY_PREMISE.get(parsed.algorithm)


def premises_of(method: str, metric: str) -> tuple[str, ...]:
    """The premises a claim on ``metric`` about ``method`` rests on: the method's
    (:func:`premise_of`) and those of that metric of its algorithm (FedMKT's ``llm/em``)."""
    found = [premise_of(method), _METRIC_PREMISE.get((parse_method(method).algorithm, metric))]
    return tuple(p for p in found if p is not None)


def _first(runs: Sequence[Mapping[str, Any]], methods: Sequence[str]) -> Mapping[str, Any] | None:
    """Round 0 of the first run of one of ``methods`` (the model before training)."""
    for run in runs:
        if run["method"] in methods and run["rounds"]:
            return run["rounds"][0]
    return None


def _zero_shot_em(runs: Sequence[Mapping[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
    """The large and small models' zero-shot EM: ``{"": overall, category: EM}`` each, with
    what the runs do not record left out."""
    large: dict[str, float] = {}
    small: dict[str, float] = {}
    zero = _first(runs, ["zero-shot"])
    if zero is not None:
        overall = zero.get("llm/em", zero.get("em"))
        if overall is not None:
            large[""] = float(overall)
        large |= {k.split("/", 1)[1]: float(v) for k, v in zero.items() if k.startswith("em/")}
        if "slm/em" in zero:
            small[""] = float(zero["slm/em"])
        # The tenants' small models' mean per category (several SLMs: FedMKT heterogeneous).
        small |= {
            k.removeprefix(_SMALL_CATEGORY): float(v)
            for k, v in zero.items() if k.startswith(_SMALL_CATEGORY)
        }
    if "" not in small:
        proxy = next((r["rounds"][0] for r in runs if r["rounds"] and "small/em" in r["rounds"][0]), None)
        if proxy is not None:
            small[""] = float(proxy["small/em"])
    trained = _first(runs, _SMALL_RUNS)
    if trained is not None:
        if "em" in trained:
            small.setdefault("", float(trained["em"]))
        for key, value in trained.items():
            if key.startswith("em/"):
                small.setdefault(key.split("/", 1)[1], float(value))
    return large, small


def _large_knows_more(runs: Sequence[Mapping[str, Any]], suite: _Suite) -> Premise:
    constant = suite.constant_em
    large, small = _zero_shot_em(runs)
    if "" not in large or "" not in small:
        missing = " and ".join(n for n, d in (("large", large), ("small", small)) if "" not in d)
        return Premise(
            LARGE_KNOWS_MORE, "not measured", f"no zero-shot EM of the {missing} model",
            f"These runs hold no zero-shot EM of the {missing} model.",
        )
    overall_ok = large[""] >= MIN_LARGE_EM and large[""] >= MIN_RATIO * small[""]
    numbers = f"large zero-shot EM {large['']:.3f} vs small {small['']:.3f}"
    compared = sorted(c for c in large if c and c in small)
    # A category is read only against its constant answer's EM.
    known = constant or {}
    categories = compared if all(c in known for c in compared) else []
    cannot = [
        c for c in categories
        if small[c] - known[c] <= SMALL_CANNOT_EM and large[c] - known[c] >= MIN_LARGE_EM
    ]
    if categories:
        per = ", ".join(f"{c} {large[c]:.2f} vs {small[c]:.2f} ({known[c]:.2f})" for c in categories)
        per_category = (
            f"per category (large vs small; the constant answer's EM in brackets): {per}; "
            f"categories small cannot do (≤ {SMALL_CANNOT_EM:g} above the constant answer) and "
            f"large can (≥ {MIN_LARGE_EM:g} above it): {', '.join(cannot) or 'none'}"
        )
    elif compared:
        per_category = "per category: the constant answer's EM is not recorded"
    else:
        per_category = "per category: small's not recorded"
    if overall_ok and categories and not cannot:
        numbers += "; no category small cannot do and large can"
    if not overall_ok or (categories and not cannot):
        status: Status = "fails"
    else:
        status = "holds" if categories else "not measured"
    ratio = f"{large[''] / small['']:.1f}×" if small[""] else "small 0"
    bar = f"{ratio} small's; needs ≥ {MIN_LARGE_EM:g} and ≥ {MIN_RATIO:g}×: {'holds' if overall_ok else 'fails'}"
    overall = f"large zero-shot EM {large['']:.3f} vs small {small['']:.3f}"
    return Premise(LARGE_KNOWS_MORE, status, numbers, f"{overall} ({bar}); {per_category}.")


def _tenants_teach(runs: Sequence[Mapping[str, Any]], suite: _Suite) -> Premise:
    large, _ = _zero_shot_em(runs)
    own = [r["rounds"][-1] for r in runs if r["method"] == _TENANTS_OWN and r["rounds"]]
    categories = sorted(
        c for c in large if c and own and all(f"{_SMALL_CATEGORY}{c}" in last for last in own)
    )
    if suite.public_categories is None or not categories:
        missing = "the public set's categories" if suite.public_categories is None else (
            f"the LLM's zero-shot and the tenants' own models' ({_TENANTS_OWN}) EM per category"
        )
        return Premise(
            TENANTS_TEACH, "not measured", f"{missing} not recorded",
            f"These runs do not record {missing}.",
        )
    tenants = {c: statistics.fmean(last[f"{_SMALL_CATEGORY}{c}"] for last in own) for c in categories}
    public = set(suite.public_categories)
    # EMs are shares of a few dozen records: a mean that meets the bar up to rounding meets it.
    teach = [c for c in categories if tenants[c] - large[c] >= MIN_TEACH_EM - 1e-9]
    crossing = [c for c in teach if c in public]
    status: Status = "holds" if crossing else "fails"
    per = ", ".join(
        f"{c} {tenants[c]:.2f} vs {large[c]:.2f}{'' if c in public else ' (not in the public set)'}"
        for c in categories
    )
    if crossing:
        numbers = f"tenants beat the LLM on public-set categories {', '.join(crossing)}"
    elif teach:
        numbers = f"tenants beat the LLM only on {', '.join(teach)}, which the public set lacks"
    else:
        numbers = "the tenants' models beat the LLM in no category"
    return Premise(
        TENANTS_TEACH, status, numbers,
        f"{numbers}. Per category, the tenants' own trained models ({_TENANTS_OWN}, final round, "
        f"mean over seeds) vs the LLM's zero-shot EM: {per}; needs ≥ {MIN_TEACH_EM:g} above "
        "the LLM in a category the public set holds.",
    )


def _synthetic_used(runs: Sequence[Mapping[str, Any]], suite: _Suite) -> Premise:
    del suite  # not a per-category premise
    fewfedpit = [r for r in runs if premise_of(r["method"]) == SYNTHETIC_USED]
    unrecorded = sum(1 for r in fewfedpit if not r.get("synthesis_steps"))
    if not fewfedpit or unrecorded:
        return Premise(
            SYNTHETIC_USED, "not measured", "synthetic examples per client step not recorded",
            f"Not recorded: {unrecorded} of the {len(fewfedpit)} FewFedPIT runs (beta < 1) lack "
            "the count of client steps that used a synthetic example.",
        )
    used = [e["used"] for r in fewfedpit for e in r["synthesis_steps"]]
    steps, used_steps = len(used), sum(1 for u in used if u >= 1)
    share = used_steps / steps if steps else 0.0
    status: Status = "holds" if share > MIN_SYNTHETIC_SHARE else "fails"
    numbers = f"{used_steps} of {steps} client steps used ≥ 1 synthetic example"
    return Premise(
        SYNTHETIC_USED, status, numbers,
        f"{numbers} ({100 * share:.0f} %; goal > {100 * MIN_SYNTHETIC_SHARE:.0f} %: {status}), "
        f"{sum(used)} synthetic examples used in all, over {len(fewfedpit)} "
        "FewFedPIT runs (beta < 1).",
    )


_MEASURE: Final = {
    LARGE_KNOWS_MORE: _large_knows_more,
    TENANTS_TEACH: _tenants_teach,
    SYNTHETIC_USED: _synthetic_used,
}


def measure(
    runs: Sequence[Mapping[str, Any]],
    names: Sequence[str] = tuple(_MEASURE),
    *,
    constant_em: Mapping[str, float] | None = None,
    public_categories: Collection[str] | None = None,
) -> dict[str, Premise]:
    """Each premise of ``names`` as measured on ``runs`` (a quality benchmark's ``runs``),
    with ``constant_em`` the test set's constant-answer EM per category
    (:func:`fedtune.benchmarks.suite.recorded_constant_answers`; without it no category is
    read and the large-model premise is at best "not measured") and ``public_categories``
    the categories the public set holds
    (:func:`fedtune.benchmarks.suite.recorded_public_categories`; without it the tenants-teach
    premise is "not measured")."""
    suite = _Suite(constant_em, public_categories)
    return {name: _MEASURE[name](runs, suite) for name in names}


def premise_lines(
    runs: Sequence[Mapping[str, Any]],
    *,
    constant_em: Mapping[str, float] | None = None,
    public_categories: Collection[str] | None = None,
) -> list[str]:
    """The line of every premise a claim about a method of ``runs`` can rest on, in a fixed
    order."""
    metrics = {m for _, m in _METRIC_PREMISE}
    found = {p for r in runs for m in (*metrics, "em") for p in premises_of(r["method"], m)}
    names = [n for n in _MEASURE if n in found]
    measured = measure(runs, names, constant_em=constant_em, public_categories=public_categories)
    return [p.line for p in measured.values()]
