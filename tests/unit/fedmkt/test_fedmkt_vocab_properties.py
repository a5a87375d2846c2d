"""Properties of the MinED mapping over whole vocabularies of four tokenizer families (issue 29)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, normalizers
from transformers import PreTrainedTokenizerFast

from fedtune.algorithms.fedmkt import vocab
from fedtune.benchmarks.token_mapping import FAMILIES, word_fragment_hits
from tests.helpers.tokenizers import byte_bpe, metaspace_bpe


def _byte_fallback_bpe() -> PreTrainedTokenizerFast:
    """A Llama-like SentencePiece BPE: "▁" pieces, the 256 ``<0xNN>`` byte fallbacks, and
    Llama's normaliser (a "▁" prepended to the text, spaces replaced by "▁")."""
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += ["▁", "t", "h", "e", "A", "▁t", "▁th", "▁the", "中"]
    core = Tokenizer(models.BPE(
        vocab={p: i for i, p in enumerate(pieces)},
        merges=[("▁", "t"), ("▁t", "h"), ("▁th", "e")], unk_token="<unk>", byte_fallback=True,
    ))
    core.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    core.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()])
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@pytest.mark.parametrize("name", FAMILIES)
def test_every_tokenizer_maps_onto_itself_as_the_identity(families, name):
    tok = families[name]
    table = vocab.map_vocabulary(tok, tok)
    moved = [(tok.convert_ids_to_tokens(i), tok.convert_ids_to_tokens(int(table[i])))
             for i in np.nonzero(table != np.arange(len(tok)))[0][:5]]
    assert moved == []  # MiniLM's "##中" went to "中" (BERT pads CJK with spaces)


@pytest.mark.parametrize("name", FAMILIES)
def test_the_comparison_normalizer_is_idempotent_over_the_vocabulary(families, name):
    tok = families[name]
    norm = vocab.comparison_normalizer(tok)
    once = vocab.canonical_tokens(tok, norm)
    if norm is None:
        return
    body = [t.removeprefix(vocab.BOUNDARY) for t in once if t is not None]
    assert [b for b in body if norm.normalize_str(b) != b] == []


def test_byte_fallback_pieces_stand_for_their_bytes():
    tok = _byte_fallback_bpe()
    assert tok("the 中", add_special_tokens=False)["input_ids"] == [tok.convert_tokens_to_ids(t) for t in ["▁the", "▁", "中"]]
    assert np.array_equal(vocab.map_vocabulary(tok, tok), np.arange(len(tok)))  # main: Prepend
    norm = vocab.comparison_normalizer(tok)
    assert all(norm.normalize_str(t.removeprefix(vocab.BOUNDARY)) == t.removeprefix(vocab.BOUNDARY)
               for t in vocab.canonical_tokens(tok, norm) if t is not None)
    canon = vocab.canonical_tokens(tok)
    assert canon[tok.convert_tokens_to_ids("<0x41>")] == "A"
    assert vocab.is_byte_fragment(canon[tok.convert_tokens_to_ids("<0xE4>")])
    gpt2 = byte_bpe()
    table = vocab.map_vocabulary(gpt2, tok)  # a piece wins over the byte fallback of its text
    assert tok.convert_ids_to_tokens(int(table[gpt2.convert_tokens_to_ids("A")])) == "A"


@pytest.mark.parametrize(("src", "dst"), list(itertools.permutations(FAMILIES, 2)))  # self: identity
def test_no_word_token_maps_onto_a_byte_fragment_or_a_special_token(families, src, dst):
    s, d = families[src], families[dst]
    words, hits = word_fragment_hits(s, d, vocab.map_vocabulary(s, d))
    assert words > 100
    assert hits[:5] == []  # main: MiniLM "see" -> the builtin's byte piece "\xee"


def test_byte_pieces_compare_as_bytes():
    tok = byte_bpe()
    canon = vocab.canonical_tokens(tok)
    pieces = [canon[i] for i in tok("中", add_special_tokens=False)["input_ids"]]
    assert len(pieces) == 3 and all(vocab.is_byte_fragment(p) for p in pieces)
    assert vocab.join_texts(pieces) == "中" and vocab.join_texts(pieces[:2]) != "中"
    assert not any("\\x" in (p or "") for p in canon)  # no escape text to meet ASCII words


def _undeclared_unk() -> PreTrainedTokenizerFast:
    """A SentencePiece-style BPE whose model emits "<unk>" but whose wrapper names no unk."""
    tok = metaspace_bpe()
    return PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer, bos_token="<s>", eos_token="</s>")


def test_special_tokens_map_by_role_not_text(families):
    minilm, plain = families["minilm-wordpiece"], _undeclared_unk()
    assert plain.unk_token is None
    to_plain = vocab.map_vocabulary(minilm, plain)
    assert plain.convert_ids_to_tokens(int(to_plain[minilm.unk_token_id])) == "<unk>"
    back = vocab.map_vocabulary(plain, minilm)
    assert minilm.convert_ids_to_tokens(int(back[plain.convert_tokens_to_ids("<unk>")])) == "[UNK]"
    assert vocab.canonical_tokens(plain)[plain.convert_tokens_to_ids("<unk>")] is None
