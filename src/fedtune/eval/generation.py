"""Greedy decoding for the generation metrics (GSM-8K exact match, Rouge-L, memorization).

All three papers decode greedily for evaluation (FewFedPIT states it; FedBiOT's and FedPT's
references set ``do_sample=False``). Prompts are batched with left padding so every prompt
ends where generation starts; the result for a prompt does not depend on its batch-mates.
Only the continuation is returned, cut at the first end-of-sequence token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from fedtune.core.errors import ConfigError, DataError, ModelError
from fedtune.eval._model_utils import eval_mode, model_device


def _pad_id(tokenizer: PreTrainedTokenizerBase) -> int:
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        pad_id = tokenizer.eos_token_id
    if pad_id is None:
        raise ModelError(
            "the tokenizer has neither a pad nor an eos token, so prompts cannot be batched",
            fix="Give the tokenizer a pad_token (or eos_token) before evaluating.",
        )
    return int(pad_id)


def generate_greedy(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    max_new_tokens: int,
    *,
    batch_size: int = 8,
    add_special_tokens: bool = True,
) -> list[str]:
    """Greedy continuations of ``prompts``, without the prompt text.

    Args:
        model: A causal LM with ``generate`` (a transformers or peft model).
        tokenizer: Its tokenizer.
        prompts: Prompts, each formatted as in training.
        max_new_tokens: Most tokens to generate per prompt.
        batch_size: Prompts decoded together.
        add_special_tokens: Passed to the tokenizer; keep it as training tokenised prompts.

    Returns:
        One decoded continuation per prompt, in order, special tokens removed.

    Raises:
        ConfigError: ``max_new_tokens`` or ``batch_size`` < 1.
        DataError: A prompt tokenises to nothing (the model needs at least one token).
        ModelError: The tokenizer has no pad or eos token.
    """
    if max_new_tokens < 1 or batch_size < 1:
        raise ConfigError(
            f"generate_greedy needs max_new_tokens >= 1 and batch_size >= 1; got "
            f"max_new_tokens={max_new_tokens}, batch_size={batch_size}",
            fix="Set positive generation lengths and batch sizes in the evaluation section.",
        )
    pad_id = _pad_id(tokenizer)
    eos_id = tokenizer.eos_token_id
    device = model_device(model)
    outputs: list[str] = []
    with eval_mode(model):
        for start in range(0, len(prompts), batch_size):
            chunk = list(prompts[start : start + batch_size])
            encoded = [
                tokenizer(p, add_special_tokens=add_special_tokens)["input_ids"] for p in chunk
            ]
            for offset, ids in enumerate(encoded):
                if not ids:
                    raise DataError(
                        f"prompt {start + offset} ({chunk[offset]!r}) tokenises to no token",
                        fix="Use a non-empty prompt, or a tokenizer that adds a BOS token.",
                    )
            # Left padding by hand: it does not depend on the tokenizer's padding_side.
            width = max(len(ids) for ids in encoded)
            input_ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, ids in enumerate(encoded):
                input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
                attention_mask[row, width - len(ids) :] = 1
            generated = model.generate(  # type: ignore[operator]
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                num_beams=1,
                pad_token_id=pad_id,
                eos_token_id=eos_id,
            )
            for row in generated[:, width:].tolist():
                if eos_id is not None and eos_id in row:
                    row = row[: row.index(eos_id)]
                outputs.append(str(tokenizer.decode(row, skip_special_tokens=True)))
    return outputs


def greedy_generate_fn(
    model: nn.Module, tokenizer: PreTrainedTokenizerBase, max_new_tokens: int
) -> Callable[[str], str]:
    """A ``prompt -> continuation`` function, as :func:`memorization_audit` takes."""

    def generate(prompt: str) -> str:
        return generate_greedy(model, tokenizer, [prompt], max_new_tokens)[0]

    return generate
