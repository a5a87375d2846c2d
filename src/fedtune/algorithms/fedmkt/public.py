"""The shared public set as each party sees it: the same examples, its own tokenization.

Every party reads the public set itself; the provider puts its content hash in each broadcast
and a tenant whose copy hashes differently refuses to go on (knowledge on different texts
would be aligned and compared as if it were on the same ones).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedtune.algorithms.fedmkt.transfer import Side
from fedtune.algorithms.fedmkt.vocab import canonical_tokens, content_hash
from fedtune.core.errors import DataError, PublicSetMismatch
from fedtune.data.formats import Example
from fedtune.data.tokenize import encode_example


def public_hash(examples: Sequence[Example]) -> str:
    """sha256 of the examples' text fields, in order."""
    digest = hashlib.sha256()
    for e in examples:
        digest.update(json.dumps([e.instruction, e.input, e.response], ensure_ascii=False).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def check_same_public(expected: str, examples: Sequence[Example], uri: str | None, who: str) -> None:
    """Refuse a public set whose hash is not the provider's.

    Raises:
        PublicSetMismatch: The hashes differ (the message names both).
    """
    found = public_hash(examples)
    if found != expected:
        raise PublicSetMismatch(
            f"{who}: the public set at {uri!r} ({len(examples)} examples) has content hash "
            f"sha256:{found}, the provider's broadcast sha256:{expected}; knowledge would be "
            "compared on different texts, so this step refuses the broadcast"
        )


def side(tokenizer: Any, examples: Sequence[Example], max_len: int) -> tuple[Side, list[int]]:
    """A party's :class:`Side` of the public set and its responses' character counts.

    Examples whose prompt alone fills ``max_len`` in this tokenization are left out.
    """
    rows, samples, chars = [], [], []
    for index, example in enumerate(examples):
        try:
            rows.append(encode_example(example, tokenizer, max_len))
        except DataError:
            continue
        samples.append(index)
        chars.append(len(example.response) + 1)  # + 1: the end of the response (EOS)
    return Side(canonical_tokens(tokenizer), rows, np.asarray(samples, dtype=np.int64), content_hash(tokenizer)), chars
