"""Leakage of a benchmark run: FewFedPIT's discoverable-memorization audit of the final model.

The attacker prompts the final global model with the training prompt of records drawn from
the tenants' data, decodes greedily and scores Rouge-L against the true response
(:func:`fedtune.eval.memorization.memorization_audit`; the paper draws 100 records). Every
method and seed of one benchmark is audited on the same records (one seeded draw), which
Centralized trains on too: its data is exactly the tenants' records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from torch import nn
from transformers import PreTrainedTokenizerBase

from fedtune.data.formats import to_example
from fedtune.data.templates import render_prompt
from fedtune.eval.generation import greedy_generate_fn
from fedtune.eval.memorization import memorization_audit

__all__ = ["LeakageAudit"]

# Tokens generated beyond the longest true response (as the test set's scoring does).
_SLACK_TOKENS: Final = 4


class LeakageAudit:
    """The training prompts and responses of the tenants' records, ready to audit models."""

    def __init__(
        self,
        records: Sequence[Mapping[str, Any]],
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_records: int,
        seed: int = 0,
    ) -> None:
        examples = [to_example(dict(r)) for r in records]
        self.pairs = [(render_prompt(e), e.response) for e in examples]
        self.max_records = max_records
        self.seed = seed
        longest = max(
            len(tokenizer(e.response, add_special_tokens=False)["input_ids"]) for e in examples
        )
        self.max_new_tokens = longest + _SLACK_TOKENS

    def __call__(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase) -> dict[str, float]:
        """``leakage`` (mean Rouge-L, the paper's number) and ``leakage/reproduced`` (share
        of audited records at or above Rouge-L 0.7) of ``model``."""
        report = memorization_audit(
            greedy_generate_fn(model, tokenizer, self.max_new_tokens),
            self.pairs,
            max_examples=self.max_records,
            seed=self.seed,
        )
        return {"leakage": report.mean_rouge_l, "leakage/reproduced": report.reproduced_rate}
