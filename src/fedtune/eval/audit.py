"""The memorization audit of a loaded model on numbered training records.

Shared by ``fedtune audit memorization`` and the tenant-side audit step of a job: each record
is prompted with its training template (:func:`fedtune.data.templates.training_prompt`), the
model decodes greedily, and :func:`fedtune.eval.memorization.memorization_audit` scores
Rouge-L against the true response. Records are named by their line in the data file; the
:class:`AuditOutcome` keeps the generations, which only the data's owner may see.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fedtune.data.formats import Example
from fedtune.data.templates import training_prompt
from fedtune.eval.generation import generate_greedy
from fedtune.eval.memorization import (
    AuditScores,
    MemorizationReport,
    memorization_audit,
    sample_indices,
)

TOP_LEAKED = 10
"""How many of the highest-scoring records a report names (by line number)."""

GENERATION_BATCH = 8
"""Prompts decoded together (left-padded; a prompt's result does not depend on its batch)."""


@dataclass(frozen=True)
class AuditOutcome:
    """One audit: the report and the file line of each audited record."""

    report: MemorizationReport
    lines: tuple[int, ...]

    @property
    def scores(self) -> AuditScores:
        """The numbers only: what may leave the data's owner."""
        return AuditScores.of(self.report)

    def top_leaked(self, k: int = TOP_LEAKED) -> list[tuple[int, float]]:
        """``(line, Rouge-L)`` of the ``k`` highest-scoring records, highest first."""
        ranked = sorted(zip(self.lines, self.report.scores, strict=True), key=lambda p: (-p[1], p[0]))
        return ranked[:k]

    def private_json(self) -> dict[str, Any]:
        """Everything, generations included: for the data owner's own store only."""
        return {
            "scores": self.scores.to_json(),
            "top_leaked": [{"line": line, "rouge_l": s} for line, s in self.top_leaked()],
            "records": [
                {"line": line, "rouge_l": score, "generation": text}
                for line, score, text in zip(
                    self.lines, self.report.scores, self.report.generations, strict=True
                )
            ],
        }


def audit_model(
    model: Any,
    tokenizer: Any,
    records: Sequence[tuple[int, Example]],
    *,
    max_records: int | None,
    seed: int,
    threshold: float,
    max_new_tokens: int,
    on_record: Callable[[], None] | None = None,
) -> AuditOutcome:
    """Audit ``model`` on a seeded sample of ``records`` (``(line, example)`` pairs).

    Args:
        model: A causal LM (transformers or peft) in any mode; generation runs in eval mode.
        tokenizer: Its tokenizer.
        records: The training records with their line numbers.
        max_records: Audit at most this many (seeded sample); all when None.
        seed: Seed of the sample.
        threshold: Rouge-L at or above which a record counts as reproduced.
        max_new_tokens: Most tokens generated per prompt.
        on_record: Called after each generated record (progress bars).

    Raises:
        DataError: No records.
        ConfigError: ``threshold`` outside [0, 1], ``max_records`` or ``max_new_tokens`` < 1.
    """
    pairs = [(training_prompt(example, tokenizer), example.response) for _, example in records]
    decoded: dict[str, str] = {}

    def generate(prompt: str) -> str:
        # First call (after memorization_audit validated its arguments): decode the audit's
        # whole sample in batches instead of one prompt at a time.
        if not decoded:
            chosen = [pairs[i][0] for i in sample_indices(len(pairs), max_records, seed)]
            for start in range(0, len(chosen), GENERATION_BATCH):
                chunk = chosen[start : start + GENERATION_BATCH]
                texts = generate_greedy(
                    model, tokenizer, chunk, max_new_tokens, batch_size=GENERATION_BATCH
                )
                decoded.update(zip(chunk, texts, strict=True))
                for _ in chunk:
                    if on_record is not None:
                        on_record()
        return decoded[prompt]

    report = memorization_audit(
        generate, pairs, threshold=threshold, max_examples=max_records, seed=seed
    )
    return AuditOutcome(report=report, lines=tuple(records[i][0] for i in report.indices))
