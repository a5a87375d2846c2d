"""Small tokenizers of three families trained on a fixed corpus (tests only)."""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerFast

from fedtune.models import tokenizer_families
from fedtune.models.tokenizer import train_tokenizer

CORPUS = [
    "we utilize the dynamic programming approach to align tokens",
    "the quick brown fox jumps over the lazy dog",
    "dynamic programming aligns two tokenizations of one sentence",
    "knowledge transfer between large and small language models",
    "Below is an instruction that describes a task. Write a response.",
] * 20


def metaspace_bpe(vocab_size: int = 300, texts: Sequence[str] = CORPUS) -> PreTrainedTokenizerFast:
    """A SentencePiece-style BPE, as Llama's."""
    return tokenizer_families.metaspace_bpe(texts, vocab_size)


def wordpiece(vocab_size: int = 300, texts: Sequence[str] = CORPUS) -> PreTrainedTokenizerFast:
    """An uncased WordPiece, as BERT's."""
    return tokenizer_families.wordpiece(texts, vocab_size)


def byte_bpe(vocab_size: int = 400, texts: Sequence[str] = CORPUS) -> PreTrainedTokenizerFast:
    """A GPT-2-style byte-level BPE."""
    return train_tokenizer(texts, vocab_size=vocab_size)
