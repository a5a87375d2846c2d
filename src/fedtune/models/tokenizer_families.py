"""Small tokenizers of other families than the builtin byte-level BPE, trained offline with
``tokenizers``: a SentencePiece-style BPE (Llama's "▁" boundaries) and an uncased WordPiece
(BERT's "##" continuations). FedMKT's example and tests use them as tenants' tokenizers."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]


def _wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def metaspace_bpe(texts: Sequence[str], vocab_size: int = 300) -> PreTrainedTokenizerFast:
    """A SentencePiece-style BPE ("▁" word boundaries), as Llama's."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS))
    return _wrap(tok)


def wordpiece(texts: Sequence[str], vocab_size: int = 300) -> PreTrainedTokenizerFast:
    """An uncased WordPiece ("##" continuations), as BERT's."""
    tok = Tokenizer(models.WordPiece(unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(
        texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIALS)
    )
    return _wrap(tok)
