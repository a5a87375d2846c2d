"""Greedy exact match per category, and held-out loss, of a model on the suite's test set.

A prediction is the greedy continuation of the training prompt (Alpaca template), cut at the
end-of-sequence token. It is correct when it equals the reference after stripping outer
whitespace; for arithmetic only the stated answer counts (``The answer is N``, extracted as
for GSM-8K), since the worked sum before it is the chain of thought, not the answer.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from torch import nn
from transformers import PreTrainedTokenizerBase

from fedtune.data.formats import Example, to_example
from fedtune.data.templates import render_prompt
from fedtune.data.tokenize import collate, encode_examples
from fedtune.eval.diversity import distinct_n
from fedtune.eval.generation import generate_greedy
from fedtune.eval.gsm8k import exact_match as gsm8k_exact_match
from fedtune.eval.loss import lm_eval_loss
from fedtune.eval.rouge import rouge_l_corpus

__all__ = ["EvalSet", "answer_budget", "answer_correct", "evaluate_model", "local_score"]

# Tokens generated beyond the longest reference answer, so a model that has learnt the answer
# but not where to stop is still scored on the answer, then marked wrong for the extra text.
_SLACK_TOKENS: Final = 4


def _stripped_equal(prediction: str, reference: str) -> bool:
    return prediction.strip() == reference.strip()


def _arithmetic(prediction: str, reference: str) -> bool:
    return gsm8k_exact_match(prediction, reference)


CHECKS: Final[dict[str, Callable[[str, str], bool]]] = {"arithmetic": _arithmetic}


def answer_correct(category: str | None, prediction: str, reference: str) -> bool:
    """Whether ``prediction`` answers like ``reference`` for a record of ``category``."""
    return CHECKS.get(category or "", _stripped_equal)(prediction, reference)


class EvalSet:
    """A test set prepared once: prompts, references, categories and loss batches."""

    def __init__(
        self,
        records: Sequence[Mapping[str, Any]],
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_seq_len: int,
        batch_size: int = 50,
    ) -> None:
        self.examples: list[Example] = [to_example(dict(r)) for r in records]
        self.categories = [e.category or "" for e in self.examples]
        self.prompts = [render_prompt(e) for e in self.examples]
        self.references = [e.response for e in self.examples]
        self.batch_size = batch_size
        self._tokenizer = tokenizer
        encoded = encode_examples(self.examples, tokenizer, max_seq_len)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.loss_batches = [
            collate(encoded[i : i + batch_size], int(pad))
            for i in range(0, len(encoded), batch_size)
        ]
        self.max_new_tokens = answer_budget(tokenizer, self.references)

    def predictions(
        self, model: nn.Module, tokenizer: PreTrainedTokenizerBase | None = None
    ) -> list[str]:
        """Greedy continuations of every prompt."""
        return generate_greedy(
            model,
            tokenizer or self._tokenizer,
            self.prompts,
            self.max_new_tokens,
            batch_size=self.batch_size,
        )


def answer_budget(tokenizer: PreTrainedTokenizerBase, references: Sequence[str]) -> int:
    """Tokens to generate: the longest reference's, plus a few to see where the model stops."""
    longest = max(len(tokenizer(r, add_special_tokens=False)["input_ids"]) for r in references)
    return longest + _SLACK_TOKENS


def evaluate_model(
    model: nn.Module, eval_set: EvalSet, tokenizer: PreTrainedTokenizerBase | None = None
) -> dict[str, float]:
    """``em`` (all records), ``em/<category>``, ``rouge_l``, ``dist3``, ``dist4`` (FedPT's
    generation metrics, on the same greedy predictions) and ``test_loss`` of ``model``.

    ``em`` is the mean over categories (each category weighs the same, whatever its count).
    """
    predictions = eval_set.predictions(model, tokenizer)
    hits: dict[str, list[bool]] = defaultdict(list)
    for category, prediction, reference in zip(
        eval_set.categories, predictions, eval_set.references, strict=True
    ):
        hits[category].append(answer_correct(category, prediction, reference))
    metrics = {f"em/{c}": sum(v) / len(v) for c, v in sorted(hits.items())}
    metrics["em"] = sum(metrics.values()) / len(metrics)
    metrics["rouge_l"] = rouge_l_corpus(predictions, eval_set.references)
    metrics["dist3"] = distinct_n(predictions, 3)
    metrics["dist4"] = distinct_n(predictions, 4)
    metrics["test_loss"] = lm_eval_loss(model, eval_set.loss_batches)
    return metrics


def local_score(metrics: Mapping[str, float], shares: Mapping[str, float]) -> float:
    """EM on a tenant's own task mix: per-category EM weighted by its category shares."""
    return sum(share * metrics.get(f"em/{c}", 0.0) for c, share in shares.items())
