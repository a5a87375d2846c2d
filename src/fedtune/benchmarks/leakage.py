"""Leakage of a benchmark run: FewFedPIT's discoverable-memorization audit of the final model.

The attacker prompts the final global model with the training prompt of records drawn from
the tenants' data, decodes greedily and scores Rouge-L against the true response
(:func:`fedtune.eval.memorization.memorization_audit`; the paper draws 100 records). Every
method and seed of one benchmark is audited on the same records (one seeded draw), which
Centralized trains on too: its data is exactly the tenants' records. The audited prompts are
decoded in batches up front (greedy decoding does not depend on batch-mates), then scored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from torch import nn
from transformers import PreTrainedTokenizerBase

from fedtune.benchmarks.scoring import answer_budget
from fedtune.data.formats import to_example
from fedtune.data.templates import render_prompt
from fedtune.eval.generation import generate_greedy
from fedtune.eval.memorization import memorization_audit, sample_indices

__all__ = ["LeakageAudit"]

_BATCH_SIZE: Final = 50


class LeakageAudit:
    """``max_records`` of the tenants' records (a seeded draw), ready to audit models."""

    def __init__(
        self,
        records: Sequence[Mapping[str, Any]],
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_records: int,
        seed: int = 0,
    ) -> None:
        chosen = sample_indices(len(records), max_records, seed)
        examples = [to_example(dict(records[i])) for i in chosen]
        self.pairs = [(render_prompt(e), e.response) for e in examples]
        self.max_new_tokens = answer_budget(tokenizer, [e.response for e in examples])

    def __call__(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase) -> dict[str, float]:
        """``leakage`` (mean Rouge-L, the paper's number) and ``leakage/reproduced`` (share
        of audited records at or above Rouge-L 0.7) of ``model``."""
        prompts = [prompt for prompt, _ in self.pairs]
        outputs = dict(
            zip(
                prompts,
                generate_greedy(
                    model, tokenizer, prompts, self.max_new_tokens, batch_size=_BATCH_SIZE
                ),
                strict=True,
            )
        )
        report = memorization_audit(outputs.__getitem__, self.pairs)
        return {"leakage": report.mean_rouge_l, "leakage/reproduced": report.reproduced_rate}
