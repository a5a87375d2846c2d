"""Encoding with the loss on the response only, truncation, and right-padding collation."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from fedtune.core.errors import DataError
from fedtune.data.formats import Example
from fedtune.data.templates import render_prompt
from fedtune.data.tokenize import IGNORE_INDEX, collate, encode_example, encode_examples

EXAMPLES = [
    Example("Reverse the letters of the word.", "banana", "ananab", "reverse"),
    Example("How many times does the letter a appear?", "", "The answer is 3.", "count"),
    Example("Say something with ünïcode ✓.", "", "Grüße ✓", None),
]


def _decode(tokenizer: PreTrainedTokenizerFast, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


@pytest.mark.parametrize("which", ["tokenizer", "bos_tokenizer"])
@pytest.mark.parametrize("example", EXAMPLES, ids=["with-input", "no-input", "unicode"])
def test_loss_only_on_response_plus_eos(
    request: pytest.FixtureRequest, which: str, example: Example
) -> None:
    tokenizer: PreTrainedTokenizerFast = request.getfixturevalue(which)
    row = encode_example(example, tokenizer, max_len=512)
    assert len(row["input_ids"]) == len(row["labels"]) == len(row["attention_mask"])
    assert row["attention_mask"] == [1] * len(row["input_ids"])
    trained = [label for label in row["labels"] if label != IGNORE_INDEX]
    assert _decode(tokenizer, trained) == example.response + tokenizer.eos_token
    masked = [
        i for i, label in zip(row["input_ids"], row["labels"], strict=True) if label == IGNORE_INDEX
    ]
    bos = tokenizer.bos_token if which == "bos_tokenizer" else ""
    assert _decode(tokenizer, masked) == bos + render_prompt(example)
    # Labels are the input ids themselves where not masked (models shift them internally).
    n_prompt = len(masked)
    assert row["labels"][n_prompt:] == row["input_ids"][n_prompt:]


def test_truncation_keeps_prompt_start_and_cuts_response_end(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    example = Example("Reverse the letters of the word.", "", "apples banana cherry " * 5, None)
    full = encode_example(example, tokenizer, max_len=10_000)
    n_prompt = full["labels"].count(IGNORE_INDEX)
    max_len = n_prompt + 4
    cut = encode_example(example, tokenizer, max_len=max_len)
    assert cut["input_ids"] == full["input_ids"][:max_len]
    assert cut["labels"] == full["labels"][:max_len]
    assert tokenizer.eos_token_id not in cut["labels"]
    trained = _decode(tokenizer, [t for t in cut["labels"] if t != IGNORE_INDEX])
    assert example.response.startswith(trained) and len(trained) < len(example.response)


def test_prompt_filling_max_len_is_an_error(tokenizer: PreTrainedTokenizerFast) -> None:
    example = Example("Reverse the letters of the word.", "", "x", None)
    with pytest.raises(DataError, match=r"prompt of \d+ tokens leaves no room .* max_len=8"):
        encode_example(example, tokenizer, max_len=8)


def test_encode_examples_skips_overlong_prompts(
    tokenizer: PreTrainedTokenizerFast, caplog: pytest.LogCaptureFixture
) -> None:
    short = Example("Hi", "", "ok", None)
    long = Example("Reverse the letters of the word. " * 20, "", "ok", None)
    limit = encode_example(short, tokenizer, max_len=10_000)["labels"].count(IGNORE_INDEX) + 3
    with caplog.at_level(logging.WARNING):
        rows = encode_examples([short, long, short], tokenizer, max_len=limit)
    assert len(rows) == 2
    assert "skipped 1 example(s)" in caplog.text
    with pytest.raises(DataError, match="no example fits max_len=3"):
        encode_examples([long], tokenizer, max_len=3)


def test_argument_errors(tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(DataError, match="max_len=1 is too small"):
        encode_examples(EXAMPLES, tokenizer, max_len=1)
    no_eos = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer)
    with pytest.raises(DataError, match="has no eos_token"):
        encode_example(EXAMPLES[0], no_eos, max_len=64)


def test_collate_pads_right_and_masks_padding(tokenizer: PreTrainedTokenizerFast) -> None:
    rows = [encode_example(e, tokenizer, max_len=512) for e in EXAMPLES]
    pad = tokenizer.pad_token_id
    batch = collate(rows, pad_id=pad)
    longest = max(len(r["input_ids"]) for r in rows)
    for name in ("input_ids", "labels", "attention_mask"):
        assert batch[name].shape == (len(rows), longest)
        assert batch[name].dtype == torch.long
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        assert batch["input_ids"][i, :n].tolist() == row["input_ids"]
        assert batch["labels"][i, :n].tolist() == row["labels"]
        assert (batch["input_ids"][i, n:] == pad).all()
        assert (batch["labels"][i, n:] == IGNORE_INDEX).all()
        assert batch["attention_mask"][i].tolist() == [1] * n + [0] * (longest - n)
    # The tokens that carry loss are exactly the responses plus EOS, nothing from padding.
    trained = (batch["labels"] != IGNORE_INDEX).sum().item()
    assert trained == sum(len(tokenizer(e.response)["input_ids"]) + 1 for e in EXAMPLES)


@pytest.mark.parametrize(
    ("batch", "pattern"),
    [
        ([], "cannot collate an empty batch"),
        ([{"input_ids": [1, 2], "labels": [1], "attention_mask": [1, 1]}], "unequal lengths"),
    ],
    ids=["empty", "ragged-row"],
)
def test_collate_errors(batch: list[dict[str, list[int]]], pattern: str) -> None:
    with pytest.raises(DataError, match=pattern):
        collate(batch, pad_id=0)


def _families() -> dict[str, PreTrainedTokenizerBase]:
    from fedtune.data.synthetic import generate
    from fedtune.models.tokenizer import load_tokenizer, train_tokenizer
    from fedtune.models.tokenizer_families import metaspace_bpe, wordpiece

    texts = [" ".join(r.values()) for r in generate(40, seed=7)]
    return {
        "builtin": load_tokenizer("builtin"),
        "bytelevel-bpe": train_tokenizer(texts, 400),
        "sentencepiece-bpe": metaspace_bpe(texts, 300),
        "wordpiece": wordpiece(texts, 300),
    }


@pytest.mark.parametrize(
    "family", ["builtin", "bytelevel-bpe", "sentencepiece-bpe", "wordpiece", "bos_tokenizer"]
)
def test_encoding_many_gives_each_example_what_encoding_it_alone_gives(
    request: pytest.FixtureRequest, family: str
) -> None:
    """Many examples are tokenised in one call: for every record of every synthetic
    category, chats among them, texts no vocabulary knows and prompts too long to fit, with
    and without a BOS the tokenizer adds, the result is each fitting example's own
    encoding, in order."""
    from fedtune.data.formats import to_example
    from fedtune.data.synthetic import generate

    tokenizer = (
        request.getfixturevalue(family) if family == "bos_tokenizer" else _families()[family]
    )
    examples = [to_example(r) for r in generate(25, seed=11)]
    examples[3:3] = [
        to_example({"messages": [{"role": "user", "content": "2+3?"},
                                 {"role": "assistant", "content": "5"}]}),
        *EXAMPLES,
        Example("x " * 200, "", "too long to fit", None),
        Example("", "", "", None),
    ]
    examples.append(to_example({"messages": [{"role": "user", "content": "Hi ✓"},
                                             {"role": "assistant", "content": "Grüße"}]}))
    max_len = 48  # some synthetic prompts do not fit either
    alone = []
    for example in examples:
        try:
            alone.append(encode_example(example, tokenizer, max_len))
        except DataError:
            continue
    assert 0 < len(alone) < len(examples)
    assert encode_examples(examples, tokenizer, max_len) == alone
