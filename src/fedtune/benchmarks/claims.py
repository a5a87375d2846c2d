"""The orderings the papers report, checked against a quality benchmark's table.

A claim says one method beats another (``>``) or is at least as good (``>=``) on the final
exact match. It is checked only when both methods ran. With several seeds the verdict uses
the standard error of the difference of means (``se``):

- ``reproduces``: the means differ in the claimed direction by more than 2 se
  (for ``>=``: the better method is not behind by more than 2 se);
- ``reversed``: the difference is more than 2 se the other way;
- ``within noise``: neither (for ``>`` only); with one seed, ``single seed`` instead, since
  the noise cannot be estimated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["PAPER_CLAIMS", "Claim", "evaluate_claims"]

_METRIC: Final = "em"


@dataclass(frozen=True)
class Claim:
    """``better`` beats (or, with ``strict=False``, matches) ``worse``, per ``source``."""

    better: str
    worse: str
    source: str
    strict: bool = True

    @property
    def text(self) -> str:
        """``a > b`` or ``a >= b``."""
        return f"{self.better} {'>' if self.strict else '>='} {self.worse}"


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
    Claim("fedbiot", "offsite-tuning", "FedBiOT (Wu et al. 2024): beats Offsite-tuning"),
    Claim("fedbiot", "fedot", "FedBiOT (Wu et al. 2024): beats FedOT"),
    Claim("fedpt", "fedavg-small", "FedPT (paper 002): beats federated tuning of the small model"),
    Claim("fedpt", "fedavg-pt", "FedPT (paper 002): distillation beats FedAvg+PT"),
    Claim("fedavg-pt", "fedavg-small", "FedPT (paper 002), Table 1: proxy-tuning beats the small model"),
    Claim("fedpt", "fedavg", "FedPT (paper 002): comparable to FedAvg on the large model", strict=False),
    Claim("fedmkt", "standalone", "FedMKT (Fan et al. 2024): beats Standalone"),
    Claim("centralized", "fedmkt", "FedMKT (Fan et al. 2024): Centralized is the upper bound"),
    Claim("fewfedpit", "fedavg", "FewFedPIT (Zhang et al. 2024): beats FedAvg with few data"),
)


def _verdict(claim: Claim, diff: float, se: float, single_seed: bool) -> str:
    if single_seed:
        return "single seed"
    if diff < -2 * se:
        return "reversed"
    if not claim.strict or diff > 2 * se:
        return "reproduces"
    return "within noise"


def evaluate_claims(
    table: Sequence[Mapping[str, Any]], claims: Sequence[Claim] = PAPER_CLAIMS
) -> list[dict[str, Any]]:
    """Check every claim whose two methods are rows of ``table`` (see :func:`summarize`)."""
    rows = {row["method"]: row["metrics"][_METRIC] for row in table if _METRIC in row["metrics"]}
    out = []
    for claim in claims:
        if claim.better not in rows or claim.worse not in rows:
            continue
        a, b = rows[claim.better], rows[claim.worse]
        diff = a["mean"] - b["mean"]
        se = math.sqrt(a["std"] ** 2 / a["n"] + b["std"] ** 2 / b["n"])
        # A deterministic baseline (zero-shot) has one run; the other side's seeds still count.
        single_seed = a["n"] < 2 and b["n"] < 2
        holds = diff > 0 if claim.strict else diff >= 0
        out.append(
            {
                "claim": claim.text,
                "source": claim.source,
                "better": claim.better,
                "worse": claim.worse,
                "difference": diff,
                "se": se,
                "holds_in_means": holds,
                "verdict": _verdict(claim, diff, se, single_seed),
            }
        )
    return out
