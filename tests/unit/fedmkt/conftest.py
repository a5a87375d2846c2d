"""The four tokenizer families of FedMKT's mapping figures, built once per test session."""

from __future__ import annotations

from typing import Any

import pytest

from fedtune.benchmarks.token_mapping import family_tokenizers


@pytest.fixture(scope="session")
def families() -> dict[str, Any]:
    """MiniLM's WordPiece, a trained byte-level BPE and SentencePiece-style BPE, the builtin."""
    return family_tokenizers()
