"""Rouge-L against the rouge-score library and a hand-written LCS."""

from __future__ import annotations

import pytest
from rouge_score import rouge_scorer

from fedtune.core.errors import DataError
from fedtune.eval.rouge import UnicodeTokenizer, rouge_l, rouge_l_corpus

PAIRS = [
    ("the cat sat on the mat", "the cat sat on the mat"),
    ("the cat sat on the mat", "a dog lay on the rug"),
    ("Paris is the capital of France.", "The capital of France is Paris."),
    ("running runners ran quickly", "the runner runs quick"),
    ("", "something"),
    ("42", "The answer is 42."),
    ("completely unrelated words here", "nothing in common at all"),
    ("Add 2 cups of flour, then stir!", "Stir in two cups of flour."),
]


@pytest.mark.parametrize("stem", [True, False])
@pytest.mark.parametrize(("prediction", "reference"), PAIRS)
def test_rouge_l_equals_the_rouge_score_library(
    prediction: str, reference: str, stem: bool
) -> None:
    expected = (
        rouge_scorer.RougeScorer(["rougeL"], use_stemmer=stem)
        .score(reference, prediction)["rougeL"]
        .fmeasure
    )
    assert rouge_l(prediction, reference, stem=stem) == pytest.approx(expected, abs=1e-12)


def _lcs(a: list[str], b: list[str]) -> int:
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i, x in enumerate(a, 1):
        for j, y in enumerate(b, 1):
            table[i][j] = (
                table[i - 1][j - 1] + 1 if x == y else max(table[i - 1][j], table[i][j - 1])
            )
    return table[-1][-1]


@pytest.mark.parametrize(
    ("prediction", "reference"),
    [
        ("a b c d e", "a c e f"),  # LCS "a c e" = 3; P = 3/5, R = 3/4
        ("the red fox", "the quick red fox ran"),  # LCS 3; P = 1, R = 3/5
    ],
)
def test_rouge_l_is_the_f_measure_of_the_longest_common_subsequence(
    prediction: str, reference: str
) -> None:
    pred, ref = prediction.split(), reference.split()
    lcs = _lcs(pred, ref)
    precision, recall = lcs / len(pred), lcs / len(ref)
    expected = 2 * precision * recall / (precision + recall)
    assert rouge_l(prediction, reference, stem=False) == pytest.approx(expected)


def test_default_tokenizer_drops_non_ascii_and_unicode_mode_keeps_it() -> None:
    # rouge-score keeps only [a-z0-9]: two identical Chinese sentences share no token.
    assert rouge_l("北京是中国的首都", "北京是中国的首都") == 0.0
    assert rouge_l("北京是中国的首都", "北京是中国的首都", unicode=True) == pytest.approx(1.0)
    # Per-character tokens: LCS of 北京是首都 / 北京是中国的首都 is 5; P = 5/5, R = 5/8.
    assert rouge_l("北京是首都", "北京是中国的首都", unicode=True) == pytest.approx(
        2 * 1.0 * (5 / 8) / (1.0 + 5 / 8)
    )
    assert rouge_l("Größe über Straße", "größe ÜBER strasse", unicode=True) == pytest.approx(2 / 3)


def test_unicode_tokenizer_splits_scripts() -> None:
    assert UnicodeTokenizer().tokenize("Hello, 世界! café_bar x2") == [
        "hello",
        "世",
        "界",
        "café",
        "bar",
        "x2",
    ]


def test_corpus_score_is_the_mean_of_sentence_scores() -> None:
    preds = [p for p, _ in PAIRS]
    refs = [r for _, r in PAIRS]
    expected = sum(rouge_l(p, r) for p, r in PAIRS) / len(PAIRS)
    assert rouge_l_corpus(preds, refs) == pytest.approx(expected)
    assert 0.0 < expected < 1.0


def test_corpus_rejects_misaligned_inputs() -> None:
    with pytest.raises(DataError, match="2 predictions but 1 references"):
        rouge_l_corpus(["a", "b"], ["a"])


def test_corpus_rejects_empty_inputs() -> None:
    with pytest.raises(DataError, match="no predictions"):
        rouge_l_corpus([], [])
