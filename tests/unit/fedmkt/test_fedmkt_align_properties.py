"""Properties of the DP alignment on sentences with accents, CJK and emoji (issue 29)."""

from __future__ import annotations

import itertools

import pytest

from fedtune.algorithms.fedmkt import align, vocab
from fedtune.benchmarks.token_mapping import FAMILIES, SENTENCES, exact_matches
from tests.helpers.tokenizers import byte_bpe


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(FAMILIES, FAMILIES)))
def test_every_exact_match_is_kept(families, src, dst):
    # A receiver token whose span the sender covers with the same text (one token, or several
    # no other receiver token shares) takes the first of them: markers, byte pieces and long
    # groups must not lose it. main lost e.g. "the" next to "▁" and "p+ro+gr+a+m+m+in+g".
    total, lost, _ = exact_matches(families[src], families[dst])
    assert total >= 20
    assert lost[:5] == []


def test_an_empty_marker_does_not_steal_an_exact_match():
    pairs = align.align_tokens(["▁the", "▁dynamic"], ["▁the", "▁", "d", "yn", "a", "mi", "c"])
    assert pairs == [(0, 0)]


def _without_markers(tokens):
    keep = [i for i, t in enumerate(tokens) if (t or "").replace(vocab.BOUNDARY, "").strip()]
    return [tokens[i] for i in keep], keep


@pytest.mark.parametrize(("src", "dst"), [("bytelevel-bpe", "sentencepiece-bpe"),
                                          ("sentencepiece-bpe", "minilm-wordpiece"),
                                          ("builtin", "sentencepiece-bpe")])
def test_markers_keep_every_exact_match_of_the_alignment_without_them(families, src, dst):
    s, d = families[src], families[dst]
    s_canon, d_canon = vocab.canonical_tokens(s), vocab.canonical_tokens(d)
    markers = 0
    for sentence in SENTENCES:
        a = [s_canon[t] for t in s(sentence, add_special_tokens=False)["input_ids"]]
        b = [d_canon[t] for t in d(sentence, add_special_tokens=False)["input_ids"]]
        markers += len(a) + len(b)
        (a2, ka), (b2, kb) = _without_markers(a), _without_markers(b)
        markers -= len(a2) + len(b2)
        bare = [((t or "").replace(vocab.BOUNDARY, "").strip()) for t in a2]
        exact = {(ka[i], kb[j]) for i, j in align.align_tokens(a2, b2)
                 if bare[i] == (b2[j] or "").replace(vocab.BOUNDARY, "").strip()}
        assert exact - set(align.align_tokens(a, b)) == set(), sentence
    assert markers > 0  # the sentences do put lone markers on one side


def test_a_long_group_takes_its_first_piece():
    word = "programming"
    pieces = list(word)  # 11 pieces for one receiver word, more than any fixed cap of 6
    pairs = align.align_tokens(["▁we", *pieces, "▁it"], ["▁we", "▁" + word, "▁it"])
    assert pairs == [(0, 0), (1, 1), (12, 2)]


def test_a_characters_first_byte_piece_is_paired(families):
    gpt2, minilm = byte_bpe(), families["minilm-wordpiece"]
    canon = vocab.canonical_tokens(gpt2)
    src = [canon[i] for i in gpt2("a 中 b", add_special_tokens=False)["input_ids"]]
    assert len(src) == 6  # "a", a lone "▁", the 3 byte pieces of "中", "▁b"
    dst_canon = vocab.canonical_tokens(minilm)
    dst = [dst_canon[i] for i in minilm("a 中 b", add_special_tokens=False)["input_ids"]]
    pairs = dict((j, i) for i, j in align.align_tokens(src, dst))
    first = next(i for i, t in enumerate(src) if vocab.is_byte_fragment(t))
    assert pairs[dst.index("▁中")] == first
