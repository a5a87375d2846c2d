"""Multiple-choice accuracy by option log-likelihood (FedMKT's RTE, WiC, BoolQ, CQA, ARC).

The model reads the prompt followed by one option; the option's score is the sum of the
log-probabilities of its tokens given everything before them, and the highest-scoring option
is the prediction (the lm-evaluation-harness ``acc`` rule; ``length_normalize`` divides by the
option's token count, a per-token ``acc_norm``).

Prompt and option are tokenised separately and concatenated, so the option's tokens are the
same whatever the prompt. Put the separating space at the start of each option
(``"Answer:"`` + ``" yes"``), as the harness does, so that it is scored as part of the option.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from fedtune.core.errors import DataError
from fedtune.eval._model_utils import eval_mode, model_device


@dataclass(frozen=True)
class ChoiceItem:
    """One multiple-choice question.

    Attributes:
        prompt: The question, formatted for the model.
        options: The candidate continuations.
        answer: Index of the correct option.
    """

    prompt: str
    options: tuple[str, ...]
    answer: int


def option_loglik(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompt: str,
    options: Sequence[str],
    *,
    length_normalize: bool = False,
) -> list[float]:
    """Log-likelihood of each option as the continuation of ``prompt``.

    Args:
        model: A causal LM returning ``.logits``.
        tokenizer: Its tokenizer; special tokens are added to the prompt only.
        prompt: The context.
        options: The continuations to score.
        length_normalize: Divide each sum by the option's number of tokens.

    Returns:
        One score per option (natural log).

    Raises:
        DataError: No options, an option or the prompt tokenises to nothing.
    """
    if not options:
        raise DataError(
            f"no options to score for prompt {prompt[:60]!r}",
            fix="Give every multiple-choice item at least two options.",
        )
    prompt_ids: list[int] = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    if not prompt_ids:
        raise DataError(
            "the prompt tokenises to no token, so the first option token has no context",
            fix="Use a non-empty prompt, or a tokenizer that adds a BOS token.",
        )
    option_ids: list[list[int]] = []
    for index, option in enumerate(options):
        ids = tokenizer(option, add_special_tokens=False)["input_ids"]
        if not ids:
            raise DataError(
                f"option {index} ({option!r}) tokenises to no token",
                fix="Remove empty options from the item.",
            )
        option_ids.append(ids)
    width = len(prompt_ids) + max(len(ids) for ids in option_ids)
    # Right padding: every option starts at the same position, and causal attention keeps
    # the padding after it from influencing its scores.
    input_ids = torch.zeros((len(options), width), dtype=torch.long)
    attention_mask = torch.zeros((len(options), width), dtype=torch.long)
    for row, ids in enumerate(option_ids):
        sequence = prompt_ids + ids
        input_ids[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
        attention_mask[row, : len(sequence)] = 1
    device = model_device(model)
    with eval_mode(model):
        logits = model(
            input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)
        ).logits
        log_probs = torch.log_softmax(logits.float(), dim=-1)
    scores: list[float] = []
    start = len(prompt_ids)
    for row, ids in enumerate(option_ids):
        # The token at position p is predicted by the logits at position p - 1.
        positions = torch.arange(start - 1, start - 1 + len(ids), device=log_probs.device)
        targets = torch.tensor(ids, dtype=torch.long, device=log_probs.device)
        total = float(log_probs[row, positions, targets].sum().item())
        scores.append(total / len(ids) if length_normalize else total)
    return scores


def predict_choice(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    item: ChoiceItem,
    *,
    length_normalize: bool = False,
) -> int:
    """Index of the highest-scoring option (the first one on a tie)."""
    scores = option_loglik(
        model, tokenizer, item.prompt, item.options, length_normalize=length_normalize
    )
    return max(range(len(scores)), key=scores.__getitem__)


def mc_accuracy(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    items: Sequence[ChoiceItem],
    *,
    length_normalize: bool = False,
) -> float:
    """Fraction of items whose highest-likelihood option is the answer.

    Raises:
        DataError: No items, an answer index outside the options, or as :func:`option_loglik`.
    """
    if not items:
        raise DataError(
            "mc_accuracy got no items", fix="Load the evaluation split before scoring it."
        )
    for index, item in enumerate(items):
        if not 0 <= item.answer < len(item.options):
            raise DataError(
                f"item {index}: answer index {item.answer} is outside its "
                f"{len(item.options)} options",
                fix="Answers are 0-based indices into the item's options.",
            )
    hits = sum(
        predict_choice(model, tokenizer, item, length_normalize=length_normalize) == item.answer
        for item in items
    )
    return hits / len(items)
