"""Turning examples into token ids with the loss on the response only, and batching them.

``encode_example`` tokenises the rendered prompt and the response separately (so the
boundary between them is exact, whatever the tokenizer merges), appends EOS to the response,
and masks the prompt positions with ``-100`` in ``labels``, the index Hugging Face and
``torch.nn.CrossEntropyLoss`` ignore.

Truncation: when prompt + response + EOS exceed ``max_len``, the sequence is cut at the end:
the prompt is kept from its start and the response loses its tail (the EOS goes first). If
the prompt alone leaves no room for a single response token the example cannot teach
anything; :func:`encode_example` raises and :func:`encode_examples` skips it.

A chat example (``messages``) is rendered with the tokenizer's chat template instead and
learns only its assistant turns (:mod:`fedtune.data.chat`); its EOS is the template's
end-of-turn text, and it is truncated the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Final

import torch
from transformers import PreTrainedTokenizerBase

from fedtune.core.errors import DataError, ExampleTooLong
from fedtune.data.chat import chat_segments
from fedtune.data.formats import Example
from fedtune.data.templates import render_prompt

__all__ = ["IGNORE_INDEX", "bos_prefix", "collate", "encode_example", "encode_examples"]

logger = logging.getLogger(__name__)

IGNORE_INDEX: Final[int] = -100

Encoded = dict[str, list[int]]


def bos_prefix(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The BOS id if this tokenizer adds one by itself (Llama does, GPT-2 does not)."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return []
    added = tokenizer("", add_special_tokens=True)["input_ids"]
    return [bos] if added[:1] == [bos] else []


def _ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _check(tokenizer: PreTrainedTokenizerBase, max_len: int) -> int:
    """Validate the arguments shared by every example; return the EOS id."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise DataError(
            f"tokenizer {type(tokenizer).__name__} has no eos_token",
            fix="Set tokenizer.eos_token (the model must learn where a response ends).",
        )
    if max_len < 2:
        raise DataError(f"max_len={max_len} is too small", fix="Use a max_len of at least 2.")
    return int(eos)


def encode_example(example: Example, tokenizer: PreTrainedTokenizerBase, max_len: int) -> Encoded:
    """Token ids, labels and attention mask for one example.

    Args:
        example: The example; its prompt comes from :func:`render_prompt`.
        tokenizer: Any Hugging Face tokenizer with an EOS token.
        max_len: Maximum sequence length in tokens (see the module docstring on truncation).

    Returns:
        ``input_ids``, ``labels`` (``-100`` on prompt positions) and ``attention_mask``, as
        equal-length lists of ints. ``labels`` are aligned with ``input_ids``, not shifted:
        Hugging Face causal LMs shift them when computing the loss.

    Raises:
        DataError: If the tokenizer has no EOS token, ``max_len`` < 2, or the prompt leaves
            no room for the response.
    """
    eos = _check(tokenizer, max_len)
    if example.messages:
        return _encode_chat(example, tokenizer, max_len)
    prompt = bos_prefix(tokenizer) + _ids(tokenizer, render_prompt(example))
    return _join(example, prompt, _ids(tokenizer, example.response), eos, max_len)


def _join(example: Example, prompt: list[int], response: list[int], eos: int, max_len: int) -> Encoded:
    """Prompt and response ids (each tokenised apart) as one truncated, labelled sequence."""
    response = [*response, eos]
    if len(prompt) >= max_len:
        raise ExampleTooLong(
            f"prompt of {len(prompt)} tokens leaves no room for the response at "
            f"max_len={max_len} (instruction starts {example.instruction[:40]!r})",
            fix="Raise max_len or drop records with long instructions/inputs.",
        )
    input_ids = (prompt + response)[:max_len]
    labels = ([IGNORE_INDEX] * len(prompt) + response)[:max_len]
    return {"input_ids": input_ids, "labels": labels, "attention_mask": [1] * len(input_ids)}


def _encode_chat(example: Example, tokenizer: PreTrainedTokenizerBase, max_len: int) -> Encoded:
    """A conversation's ids with labels on its assistant turns only (pieces tokenised apart,
    like prompt and response above, so the boundaries are exact)."""
    input_ids: list[int] = []
    labels: list[int] = []
    for text, trained in chat_segments(example.messages, tokenizer):
        ids = _ids(tokenizer, text)  # templates write BOS themselves where they want one
        input_ids += ids
        labels += ids if trained else [IGNORE_INDEX] * len(ids)
    input_ids, labels = input_ids[:max_len], labels[:max_len]
    if all(label == IGNORE_INDEX for label in labels):
        raise ExampleTooLong(
            f"conversation leaves no assistant token within max_len={max_len} (last user turn "
            f"starts {example.instruction[:40]!r})",
            fix="Raise max_len or shorten the turns before the first assistant answer.",
        )
    return {"input_ids": input_ids, "labels": labels, "attention_mask": [1] * len(input_ids)}


def encode_examples(
    examples: Iterable[Example], tokenizer: PreTrainedTokenizerBase, max_len: int
) -> list[Encoded]:
    """Encode many examples, skipping those whose prompt alone fills ``max_len``: for every
    example that fits, exactly what :func:`encode_example` gives it. The prompts, and the
    responses, are tokenised in one call each (per-text calls cost a tenant's data about
    4x the time on a fast tokenizer, and the data is encoded again every round).

    Raises:
        DataError: If every example is skipped (or there are none).
    """
    eos = _check(tokenizer, max_len)  # argument errors must not be mistaken for long prompts
    examples = list(examples)
    plain = [e for e in examples if not e.messages]
    bos = bos_prefix(tokenizer)
    ids = iter(
        zip(
            _batch_ids(tokenizer, [render_prompt(e) for e in plain]),
            _batch_ids(tokenizer, [e.response for e in plain]),
            strict=True,
        )
    )
    encoded: list[Encoded] = []
    skipped = 0
    for example in examples:
        try:
            if example.messages:
                encoded.append(_encode_chat(example, tokenizer, max_len))
            else:
                prompt, response = next(ids)
                encoded.append(_join(example, bos + prompt, response, eos, max_len))
        except ExampleTooLong:
            skipped += 1
    if skipped:
        logger.warning("skipped %d example(s) whose prompt exceeds max_len=%d", skipped, max_len)
    if not encoded:
        raise DataError(
            f"no example fits max_len={max_len} ({skipped} skipped)",
            fix="Raise max_len or check that the dataset is not empty.",
        )
    return encoded


def _batch_ids(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[list[int]]:
    """:func:`_ids` of every text, in one tokenizer call."""
    if not texts:
        return []
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def collate(batch: Sequence[Encoded], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad a batch on the right into ``int64`` tensors of shape ``(batch, longest)``.

    Padding positions get ``pad_id`` in ``input_ids``, ``0`` in ``attention_mask`` and
    ``-100`` in ``labels``, so they carry no loss.

    Raises:
        DataError: On an empty batch or rows whose three lists differ in length.
    """
    if not batch:
        raise DataError("cannot collate an empty batch", fix="Pass at least one example.")
    longest = max(len(row["input_ids"]) for row in batch)
    columns: dict[str, list[list[int]]] = {"input_ids": [], "labels": [], "attention_mask": []}
    fill = {"input_ids": pad_id, "labels": IGNORE_INDEX, "attention_mask": 0}
    for index, row in enumerate(batch):
        lengths = {name: len(row[name]) for name in columns}
        if len(set(lengths.values())) != 1:
            raise DataError(
                f"batch row {index} has unequal lengths {lengths}",
                fix="Build rows with encode_example, which keeps the three lists aligned.",
            )
        for name, column in columns.items():
            values = list(row[name])
            column.append(values + [fill[name]] * (longest - len(values)))
    return {name: torch.tensor(rows, dtype=torch.long) for name, rows in columns.items()}
