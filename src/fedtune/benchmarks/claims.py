"""The orderings the papers report, checked against a quality benchmark's runs.

A claim says one method beats another (``>``) or is at least as good (``>=``, optionally
within a ``margin``: "within a few points") on a final-round metric, exact match unless it
names another; for a metric where lower is better (``leakage``, ``test_loss``) beating means
a lower value. An ``equal`` claim says the two are the same method in effect. A claim is
checked only when both methods ran.

**The verdict rule** (the only one; :func:`verdict` applies it to every claim). Runs are
paired by seed (:mod:`fedtune.benchmarks.paired`); ``[low, high]`` is the 95% t-interval of
the mean paired *gain* of ``better`` over ``worse`` (``better - worse``, negated where lower
is better), and ``m`` the claim's margin:

- ``reproduces``: ``low > -m``: the whole interval says ``better`` is ahead (for ``>=``: not
  behind by more than the margin). ``>`` and ``>=`` differ only at the boundary, which an
  interval never decides, so both use this test;
- ``reversed``: ``high < -m``: the whole interval says the opposite;
- ``within noise``: the interval straddles ``-m``;
- an ``equal`` claim (tolerance ``t`` = its margin, else 1e-9): ``reproduces`` when the whole
  interval lies within ``[-t, t]``, ``differs`` (its "reversed") when the whole interval lies
  outside it, else ``within noise``;
- ``single seed``: fewer than two paired seeds, so no interval (an ``equal`` claim whose one
  difference is within ``t`` still reproduces: it is exact, not statistical).

**Premises** (:mod:`fedtune.benchmarks.premises`). A claim about a method whose paper assumes
a setting (FedPT and FedMKT: a large model that knows more; FedMKT's LLM-side claims also:
tenants that know what the LLM does not, on public data; FewFedPIT: synthetic data used)
gets ``no verdict: premise false (numbers)`` where the runs show that setting absent, and
``no verdict: premise not measured`` where they do not record it; its interval is still
reported, and the rule's verdict kept as ``interval_verdict``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from fedtune.benchmarks.paired import paired_difference
from fedtune.benchmarks.premises import Premise, measure, premises_of

__all__ = ["PAPER_CLAIMS", "Claim", "evaluate_claims", "final_values", "premised_verdict", "verdict"]

_METRIC: Final = "em"
#: Metrics where the better method has the lower value.
LOWER_IS_BETTER: Final[frozenset[str]] = frozenset({"leakage", "test_loss"})
# Means closer than this are equal even with no spread (floating-point noise).
_EQUAL_TOLERANCE: Final = 1e-9


@dataclass(frozen=True)
class Claim:
    """``better`` beats (or, with ``strict=False``, matches up to ``margin``; with ``equal``,
    equals) ``worse`` on ``metric``, per ``source``."""

    better: str
    worse: str
    source: str
    strict: bool = True
    metric: str = _METRIC
    margin: float = 0.0
    equal: bool = False

    @property
    def text(self) -> str:
        """``a > b``, ``a >= b - 0.05``, ``leakage: a < b``, ``a == b`` ..."""
        lower = self.metric in LOWER_IS_BETTER
        if self.equal:
            op = "=="
        else:
            op = ("<" if lower else ">") + ("" if self.strict else "=")
        margin = f" {'+' if lower else '-'} {self.margin:g}" if self.margin else ""
        prefix = "" if self.metric == _METRIC else f"{self.metric}: "
        return f"{prefix}{self.better} {op} {self.worse}{margin}"

    @property
    def premises(self) -> tuple[str, ...]:
        """The premises the claim rests on: those of its two methods on its metric
        (:func:`fedtune.benchmarks.premises.premises_of`)."""
        found = (*premises_of(self.better, self.metric), *premises_of(self.worse, self.metric))
        return tuple(dict.fromkeys(found))


PAPER_CLAIMS: Final[tuple[Claim, ...]] = (
    Claim("fedavg", "standalone", "FedIT (Zhang et al. 2024): federated tuning beats local-only"),
    Claim("standalone", "zero-shot", "FedMKT (Fan et al. 2024): Standalone beats Zero-Shot"),
    Claim("centralized", "fedavg", "FedMKT, FedIT: pooled data is the upper bound", strict=False),
    Claim("fedprox", "fedavg", "FedProx (Li et al. 2020): better under heterogeneity"),
    Claim("scaffold", "fedavg", "SCAFFOLD (Karimireddy et al. 2020): corrects client drift"),
    Claim("scaffold", "fedprox", "SCAFFOLD (Karimireddy et al. 2020): beats FedProx"),
    Claim("fedadam", "fedavg", "FedOPT (Reddi et al. 2021): adaptive server optimizers"),
    Claim("fedyogi", "fedavg", "FedOPT (Reddi et al. 2021): adaptive server optimizers"),
    Claim("fedadagrad", "fedavg", "FedOPT (Reddi et al. 2021): adaptive server optimizers"),
    *(
        Claim("fedmkt", worse, f"FedMKT (paper 003), {table}: the SLMs beat {name}", metric="slm/em")
        for worse, name, table in (
            ("zero-shot", "Zero-Shot", "Tables 2-4"),
            ("standalone-small", "Standalone", "Tables 2-4"),
            ("fedavg-small", "FedAvg", "Table 3 (Homogeneous)"),
            ("fedmkt@llm_frozen=true", "LLM2SLM", "Table 4 (One-to-One)"),
        )
    ),
    Claim(
        "fedmkt@fedavg_small=true",
        "fedavg-small",
        "FedMKT (paper 003), Table 3 (Homogeneous, FedMKT with FedAvg): the SLMs beat FedAvg",
        metric="slm/em",
    ),
    Claim("fedmkt", "zero-shot", "FedMKT (paper 003), Tables 2-4: the LLM beats Zero-Shot", metric="llm/em"),
    Claim(
        "fedmkt",
        "centralized",
        "FedMKT (paper 003), Tables 2-4: the LLM rivals Centralized (~96% of it)",
        strict=False,
        metric="llm/em",
        margin=0.05,
    ),
    Claim("fedbiot", "offsite-tuning", "FedBiOT (Wu et al. 2024): beats Offsite-tuning"),
    Claim("fedbiot", "fedot", "FedBiOT (Wu et al. 2024): beats FedOT"),
    # `--preset fedbiot`: each dropout rate, AdapFu (the row's EM) and AdapEmu.
    *(
        Claim(
            f"fedbiot@dropout={dropout}",
            f"{baseline}@dropout={dropout}",
            f"FedBiOT (Wu et al. 2024): {output} beats {name} (dropout {dropout})",
            metric=metric,
        )
        for dropout in ("0.2", "0.5")
        for baseline, name in (("fedot", "FedOT"), ("offsite-tuning", "Offsite-tuning"))
        for metric, output in (("em", "AdapFu"), ("adapemu/em", "AdapEmu"))
    ),
    # `--preset fedbiot-ablation`: what each part of FedBiOT contributes.
    Claim(
        "fedbiot@dropout=0.2",
        "fedbiot@dropout=0.2@align_steps=0",
        "FedBiOT (Wu et al. 2024), ablation: per-round emulator alignment helps",
    ),
    Claim(
        "fedbiot@dropout=0.2@adapter_size=4",
        "fedbiot@dropout=0.2@adapter_size=4@adapter_placement=edges",
        "FedBiOT (Wu et al. 2024), Algorithm 2's choice: the adapter at the top beats first 2 + last 2",
    ),
    # FedOT's adapter is 4 layers (first 2 + last 2), FedBiOT's default 2: AdapEmu at equal size.
    Claim(
        "fedbiot@dropout=0.2@adapter_size=4",
        "fedot@dropout=0.2",
        "FedBiOT (Wu et al. 2024), ablation: AdapEmu beats FedOT with an adapter of FedOT's size",
        metric="adapemu/em",
    ),
    Claim("fedpt", "fedavg-small", "FedPT (paper 002): beats federated tuning of the small model"),
    Claim("fedpt", "fedavg-pt", "FedPT (paper 002): distillation beats FedAvg+PT"),
    Claim("fedavg-pt", "fedavg-small", "FedPT (paper 002), Table 1: proxy-tuning beats the small model"),
    Claim("fedpt", "fedavg", "FedPT (paper 002): comparable to FedAvg on the large model", strict=False),
    Claim("fedmkt", "standalone", "FedMKT (Fan et al. 2024): beats Standalone"),
    Claim("centralized", "fedmkt", "FedMKT (Fan et al. 2024): Centralized is the upper bound"),
    Claim("fewfedpit", "fedavg", "FewFedPIT (Zhang et al. 2024): beats FedAvg with few data"),
    # The few-shot comparison (`fedtune bench quality --split fewshot`) runs three betas.
    Claim(
        "fewfedpit@beta=0.5",
        "centralized",
        "FewFedPIT (Zhang et al. 2024): utility within a few points of Centralized",
        strict=False,
        margin=0.05,
    ),
    Claim(
        "fewfedpit@beta=0.5", "fedavg", "FewFedPIT (Zhang et al. 2024): beats FedAvg with few data"
    ),
    *(
        Claim(
            f"fewfedpit@beta={beta}",
            "fedavg",
            "FewFedPIT (Zhang et al. 2024): leaks less than FedAvg for beta < 1",
            metric="leakage",
        )
        for beta in ("0", "0.5")
    ),
    *(
        Claim(
            "fewfedpit@beta=1",
            "fedavg",
            "FewFedPIT (Zhang et al. 2024): beta = 1 degenerates into FedAvg",
            metric=metric,
            equal=True,
        )
        for metric in ("em", "leakage")
    ),
)


def verdict(claim: Claim, gain_low: float, gain_high: float, n: int) -> str:
    """The verdict of ``claim`` given the interval of its gain (see the module docstring)."""
    if claim.equal:
        tolerance = claim.margin or _EQUAL_TOLERANCE
        if -tolerance <= gain_low and gain_high <= tolerance:
            return "reproduces"
        if n < 2:
            return "single seed"
        return "differs" if gain_low > tolerance or gain_high < -tolerance else "within noise"
    if n < 2:
        return "single seed"
    if gain_low > -claim.margin:
        return "reproduces"
    if gain_high < -claim.margin:
        return "reversed"
    return "within noise"


def premised_verdict(claim: Claim, rule: str, premises: Mapping[str, Premise]) -> str:
    """``rule`` (the interval's verdict) where every premise of ``claim`` holds, else why
    there is none."""
    found = [premises[name] for name in claim.premises]
    false = [p.numbers for p in found if p.status == "fails"]
    if false:
        return f"no verdict: premise false ({'; '.join(false)})"
    if any(p.status != "holds" for p in found):
        return "no verdict: premise not measured"
    return rule


def final_values(runs: Sequence[Mapping[str, Any]], method: str, metric: str) -> dict[int | None, float]:
    """``metric`` of ``method``'s final round, by seed (empty if it did not run or lacks it)."""
    return {
        run["seed"]: float(run["rounds"][-1][metric])
        for run in runs
        if run["method"] == method and metric in run["rounds"][-1]
    }


def evaluate_claims(
    runs: Sequence[Mapping[str, Any]],
    claims: Sequence[Claim] = PAPER_CLAIMS,
    *,
    constant_em: Mapping[str, float] | None = None,
    public_categories: Collection[str] | None = None,
) -> list[dict[str, Any]]:
    """Check every claim whose two methods are among ``runs`` (a quality benchmark's
    ``runs``) with its metric. ``difference`` is better's minus worse's mean over the paired
    seeds, in the metric's units, with its 95% interval ``low``..``high``. ``constant_em``
    (the test set's constant-answer EM per category) and ``public_categories`` (the
    categories the public set holds) are what the premises read besides the runs
    (:func:`fedtune.benchmarks.premises.measure`)."""
    out = []
    premises = measure(runs, constant_em=constant_em, public_categories=public_categories)
    for claim in claims:
        paired = paired_difference(
            final_values(runs, claim.better, claim.metric),
            final_values(runs, claim.worse, claim.metric),
        )
        if paired is None:
            continue
        lower = claim.metric in LOWER_IS_BETTER
        gain_low, gain_high = (-paired.high, -paired.low) if lower else (paired.low, paired.high)
        gain = -paired.mean if lower else paired.mean
        rule = verdict(claim, gain_low, gain_high, paired.n)
        if claim.equal:
            holds = abs(paired.mean) <= (claim.margin or _EQUAL_TOLERANCE)
        else:
            holds = gain + claim.margin > 0 if claim.strict else gain + claim.margin >= 0
        out.append(
            {
                "claim": claim.text,
                "source": claim.source,
                "better": claim.better,
                "worse": claim.worse,
                "metric": claim.metric,
                "difference": paired.mean,
                "low": paired.low,
                "high": paired.high,
                "n": paired.n,
                "seeds": list(paired.seeds),
                "holds_in_means": holds,
                "interval_verdict": rule,
                "premises": {name: premises[name].status for name in claim.premises},
                "verdict": premised_verdict(claim, rule, premises),
            }
        )
    return out
