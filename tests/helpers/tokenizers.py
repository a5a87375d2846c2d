"""Small tokenizers of different families, trained offline with ``tokenizers`` (tests only)."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

CORPUS = [
    "we utilize the dynamic programming approach to align tokens",
    "the quick brown fox jumps over the lazy dog",
    "dynamic programming aligns two tokenizations of one sentence",
    "knowledge transfer between large and small language models",
    "Below is an instruction that describes a task. Write a response.",
] * 20
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]


def _wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def metaspace_bpe(vocab_size: int = 300, texts: Sequence[str] = CORPUS) -> PreTrainedTokenizerFast:
    """A SentencePiece-style BPE ("▁" word boundaries), as Llama's."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS))
    return _wrap(tok)


def wordpiece(vocab_size: int = 300, texts: Sequence[str] = CORPUS) -> PreTrainedTokenizerFast:
    """An uncased WordPiece ("##" continuations), as BERT's."""
    tok = Tokenizer(models.WordPiece(unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(
        texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIALS)
    )
    return _wrap(tok)


def byte_bpe(vocab_size: int = 400, texts: Sequence[str] = CORPUS) -> PreTrainedTokenizerFast:
    """A GPT-2-style byte-level BPE ("Ġ" word boundaries)."""
    from fedtune.models.tokenizer import train_tokenizer

    return train_tokenizer(texts, vocab_size=vocab_size)
