"""Discoverable-memorization audit of FewFedPIT (Section 5.4, after Nasr et al., 2023).

For training examples ``s = [p || y]`` the attacker prompts the model with the prefix ``p``
(the formatted instruction), decodes greedily, and measures Rouge-L between the output ``y'``
and the true response ``y``: the higher, the more of the private data the model leaks. The
paper draws 100 examples from the clients' data; ``max_examples`` and ``seed`` do the same.

The generate function is supplied by the caller so the audit runs against anything that maps
a prompt to text: a local model (see :func:`fedtune.eval.generation.greedy_generate_fn`), a
served endpoint, or a fake in tests. It must decode greedily to match the paper.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from fedtune.core.errors import ConfigError, DataError
from fedtune.eval.rouge import rouge_l

logger = logging.getLogger(__name__)

# FewFedPIT treats Rouge-L above 0.7 as a near copy when it filters synthetic data; the same
# cut-off marks a sample as reproduced here.
DEFAULT_THRESHOLD = 0.7


@dataclass(frozen=True)
class MemorizationReport:
    """Result of :func:`memorization_audit`.

    Attributes:
        mean_rouge_l: Mean Rouge-L between generations and true responses (the paper's number).
        scores: Rouge-L per audited example, in audit order.
        indices: Index in the given ``examples`` of each audited example.
        generations: What the model produced for each audited example.
        threshold: Rouge-L at or above which an example counts as reproduced.
        num_reproduced: Examples scoring at or above ``threshold``.
        exceeds_threshold: Whether ``mean_rouge_l`` is at or above ``threshold``.
    """

    mean_rouge_l: float
    scores: tuple[float, ...]
    indices: tuple[int, ...]
    generations: tuple[str, ...]
    threshold: float
    num_reproduced: int
    exceeds_threshold: bool

    @property
    def reproduced_rate(self) -> float:
        """Fraction of audited examples at or above the threshold."""
        return self.num_reproduced / len(self.scores)


def memorization_audit(
    generate: Callable[[str], str],
    examples: Sequence[tuple[str, str]],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    max_examples: int | None = None,
    seed: int = 0,
) -> MemorizationReport:
    """Prompt with each training prompt and compare the generation to the true response.

    Args:
        generate: Maps a prompt to the model's greedy continuation (prompt excluded).
        examples: ``(prompt, response)`` pairs from training data, the prompt formatted as
            in training.
        threshold: Rouge-L at or above which an example counts as reproduced.
        max_examples: Audit a random subset of this size (seeded); all examples when None.
        seed: Seed of that subset.

    Raises:
        DataError: No examples.
        ConfigError: ``threshold`` outside [0, 1] or ``max_examples`` < 1.
    """
    if not examples:
        raise DataError(
            "memorization_audit got no training examples",
            fix="Pass (prompt, response) pairs drawn from the tenants' training data.",
        )
    if not 0.0 <= threshold <= 1.0:
        raise ConfigError(
            f"memorization threshold={threshold} is outside [0, 1]",
            fix=f"Use a Rouge-L value such as {DEFAULT_THRESHOLD}.",
        )
    if max_examples is not None and max_examples < 1:
        raise ConfigError(
            f"max_examples={max_examples} must be >= 1 (or None for all)",
            fix="FewFedPIT audits 100 examples; pass max_examples=100.",
        )
    indices = sample_indices(len(examples), max_examples, seed)
    generations: list[str] = []
    scores: list[float] = []
    for index in indices:
        prompt, response = examples[index]
        output = generate(prompt)
        generations.append(output)
        scores.append(rouge_l(output, response))
    mean = sum(scores) / len(scores)
    reproduced = sum(score >= threshold for score in scores)
    logger.info(
        "memorization audit: mean Rouge-L %.4f over %d examples, %d at or above %.2f",
        mean,
        len(scores),
        reproduced,
        threshold,
    )
    return MemorizationReport(
        mean_rouge_l=mean,
        scores=tuple(scores),
        indices=tuple(indices),
        generations=tuple(generations),
        threshold=threshold,
        num_reproduced=reproduced,
        exceeds_threshold=mean >= threshold,
    )


def sample_indices(count: int, max_examples: int | None, seed: int) -> list[int]:
    """Which of ``count`` examples an audit of ``max_examples`` (None: all) scores, sorted."""
    indices = list(range(count))
    if max_examples is not None and max_examples < count:
        indices = sorted(random.Random(seed).sample(indices, max_examples))
    return indices


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` by linear interpolation between order statistics."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class AuditScores:
    """What an audit reveals beyond its owner: numbers only, no record, index or generation.

    Attributes:
        n: Audited records.
        mean: Mean Rouge-L (the paper's number).
        p50: Median Rouge-L.
        p90: 90th percentile of Rouge-L.
        max: Highest Rouge-L.
        num_at_or_above: Records scoring at or above ``threshold``.
        threshold: The Rouge-L cut-off of ``num_at_or_above``.
    """

    n: int
    mean: float
    p50: float
    p90: float
    max: float
    num_at_or_above: int
    threshold: float

    @classmethod
    def of(cls, report: MemorizationReport) -> AuditScores:
        """The scalar summary of ``report``."""
        scores = report.scores
        return cls(
            n=len(scores),
            mean=report.mean_rouge_l,
            p50=quantile(scores, 0.5),
            p90=quantile(scores, 0.9),
            max=max(scores),
            num_at_or_above=report.num_reproduced,
            threshold=report.threshold,
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON object of the fields."""
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> AuditScores:
        """Parse :meth:`to_json` strictly: exactly the fields, numbers in range.

        Raises:
            DataError: A field is missing, extra, of the wrong type or out of range.
        """
        fields = set(cls.__dataclass_fields__)
        if not isinstance(raw, Mapping) or set(raw) != fields:
            got = sorted(raw) if isinstance(raw, Mapping) else type(raw).__name__
            raise DataError(
                f"audit scores must hold exactly {sorted(fields)}; got {got}",
                fix="Audit results are written by fedtune's audit step of the same version.",
            )
        counts = {k: raw[k] for k in ("n", "num_at_or_above")}
        rates = {k: raw[k] for k in fields - set(counts)}
        bad = [k for k, v in counts.items() if isinstance(v, bool) or not isinstance(v, int) or v < 0]
        bad += [
            k
            for k, v in rates.items()
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v <= 1.0
        ]
        if bad or counts["n"] < 1 or counts["num_at_or_above"] > counts["n"]:
            raise DataError(
                f"audit scores out of range in {sorted(bad) or ['n', 'num_at_or_above']}: "
                f"{dict(raw)}",
                fix="Counts are whole numbers (1 <= n, num_at_or_above <= n); Rouge-L values "
                "lie in [0, 1].",
            )
        return cls(**{**counts, **{k: float(v) for k, v in rates.items()}})  # type: ignore[arg-type]


def pool_scores(parts: Mapping[str, AuditScores]) -> dict[str, float]:
    """Combine per-tenant scores into the job's numbers.

    ``mean`` is weighted by audited records, so it equals the mean over every audited record
    (the paper's number over the clients' data). Quantiles do not pool from quantiles, so the
    result carries the worst tenant's ``p90`` and ``mean`` instead of pretending to; ``max``
    and the counts pool exactly.
    """
    total = sum(s.n for s in parts.values())
    return {
        "n": float(total),
        "mean": sum(s.mean * s.n for s in parts.values()) / total,
        "max": max(s.max for s in parts.values()),
        "num_at_or_above": float(sum(s.num_at_or_above for s in parts.values())),
        "worst_tenant_mean": max(s.mean for s in parts.values()),
        "worst_tenant_p90": max(s.p90 for s in parts.values()),
        "tenants": float(len(parts)),
    }
