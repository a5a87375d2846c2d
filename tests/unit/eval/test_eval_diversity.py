"""Dist-n counted by hand."""

from __future__ import annotations

import pytest

from fedtune.core.errors import ConfigError, DataError
from fedtune.eval.diversity import distinct_n


def test_distinct_bigrams_by_hand() -> None:
    texts = ["a b a b", "a b c"]
    # bigrams: (a b) (b a) (a b) | (a b) (b c) -> 5 total, 3 distinct
    assert distinct_n(texts, 2) == pytest.approx(3 / 5)


def test_distinct_unigrams_and_trigrams_by_hand() -> None:
    texts = ["the cat sat", "the cat ran", "the dog sat down"]
    assert distinct_n(texts, 1) == pytest.approx(6 / 10)  # the cat sat ran dog down
    # trigrams: (the cat sat) (the cat ran) (the dog sat) (dog sat down): all distinct
    assert distinct_n(texts, 3) == pytest.approx(1.0)


def test_ngrams_do_not_span_two_texts() -> None:
    # Joined, "x y" + "x y" would give the bigram (y x); counted per text there are 2, 1 distinct.
    assert distinct_n(["x y", "x y"], 2) == pytest.approx(1 / 2)


def test_repetitive_text_scores_low() -> None:
    assert distinct_n(["go go go go go go go go"], 3) == pytest.approx(1 / 6)


def test_custom_tokenizer() -> None:
    assert distinct_n(["The the THE"], 1, tokenize=lambda t: t.lower().split()) == pytest.approx(
        1 / 3
    )


def test_texts_shorter_than_n_score_zero() -> None:
    assert distinct_n(["one two", "three"], 3) == 0.0


def test_n_below_one_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="n=0"):
        distinct_n(["a b"], 0)


def test_no_texts_is_a_data_error() -> None:
    with pytest.raises(DataError, match="no texts"):
        distinct_n([], 3)
