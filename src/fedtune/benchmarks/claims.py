"""The orderings the papers report, checked against a quality benchmark's table.

A claim says one method beats another (``>``) or is at least as good (``>=``, optionally
within a ``margin``: "within a few points") on a final-round metric, exact match unless it
names another; for a metric where lower is better (``leakage``, ``test_loss``) beating means
a lower value. An ``equal`` claim says the two are the same method in effect. A claim is
checked only when both methods ran. With several seeds the verdict uses the standard error
of the difference of means (``se``):

- ``reproduces``: the means differ in the claimed direction by more than 2 se (for ``>=``:
  the better method's mean is not behind by more than the margin; for ``equal``: the means
  differ by at most 2 se);
- ``reversed``: the difference is more than 2 se the other way (for ``>=``: behind by more
  than margin + 2 se; ``differs`` for ``equal``);
- ``within noise``: neither; with one seed, ``single seed`` instead, since the noise cannot
  be estimated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["PAPER_CLAIMS", "Claim", "evaluate_claims"]

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


def _verdict(claim: Claim, gain: float, se: float, single_seed: bool) -> str:
    """``gain``: how far ``better`` is ahead of ``worse`` in the claimed direction."""
    if claim.equal:
        return "reproduces" if abs(gain) <= max(2 * se, _EQUAL_TOLERANCE) else "differs"
    if single_seed:
        return "single seed"
    ahead = gain + claim.margin
    if ahead < -2 * se:
        return "reversed"
    if (not claim.strict and ahead >= 0) or gain > 2 * se:
        return "reproduces"
    return "within noise"


def evaluate_claims(
    table: Sequence[Mapping[str, Any]], claims: Sequence[Claim] = PAPER_CLAIMS
) -> list[dict[str, Any]]:
    """Check every claim whose two methods are rows of ``table`` (see :func:`summarize`)
    with its metric. ``difference`` is better's mean minus worse's, in the metric's units."""
    metrics = {row["method"]: row["metrics"] for row in table}
    out = []
    for claim in claims:
        a = metrics.get(claim.better, {}).get(claim.metric)
        b = metrics.get(claim.worse, {}).get(claim.metric)
        if a is None or b is None:
            continue
        diff = a["mean"] - b["mean"]
        gain = -diff if claim.metric in LOWER_IS_BETTER else diff
        se = math.sqrt(a["std"] ** 2 / a["n"] + b["std"] ** 2 / b["n"])
        # A deterministic baseline (zero-shot) has one run; the other side's seeds still count.
        single_seed = a["n"] < 2 and b["n"] < 2
        if claim.equal:
            holds = abs(diff) <= _EQUAL_TOLERANCE
        else:
            holds = gain + claim.margin > 0 if claim.strict else gain + claim.margin >= 0
        out.append(
            {
                "claim": claim.text,
                "source": claim.source,
                "better": claim.better,
                "worse": claim.worse,
                "metric": claim.metric,
                "difference": diff,
                "se": se,
                "holds_in_means": holds,
                "verdict": _verdict(claim, gain, se, single_seed),
            }
        )
    return out
