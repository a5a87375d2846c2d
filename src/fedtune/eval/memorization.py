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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
    indices = list(range(len(examples)))
    if max_examples is not None and max_examples < len(examples):
        indices = sorted(random.Random(seed).sample(indices, max_examples))
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
