"""Rouge-L F-measure, the text-overlap metric of FedPT, FedMKT and FewFedPIT.

Scores come from Google's ``rouge-score`` package (a re-implementation of ROUGE-1.5.5), so
numbers are comparable with the papers, which all use it.

Tokenisation matters. ``rouge-score``'s default tokenizer lower-cases the text and replaces
every character outside ``[a-z0-9]`` with a space, so **non-ASCII text is dropped entirely**:
Chinese, Cyrillic or accented letters contribute no tokens, and two strings made only of such
characters both tokenise to nothing and score 0.0. Pass ``unicode=True`` to tokenise with
:class:`UnicodeTokenizer` instead (words of any script, one token per CJK character); its
scores are then not comparable with ASCII-only numbers from the papers.

An empty prediction or reference (after tokenisation) scores 0.0, as in ``rouge-score``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fedtune.core.errors import DataError

if TYPE_CHECKING:
    from rouge_score.rouge_scorer import RougeScorer

# A run of letters/digits of any script, or one CJK / kana / hangul character: those scripts do
# not separate words with spaces, so each character is the closest thing to a word.
_UNICODE_TOKEN_RE = re.compile(
    r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]|[^\W_]+",
    re.UNICODE,
)
_CJK_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


class UnicodeTokenizer:
    """Lower-cased words of any script; CJK text split into single characters.

    Implements the ``tokenize(text) -> list[str]`` interface ``rouge-score`` expects of a
    custom tokenizer. No stemming: the Porter stemmer is for English only.
    """

    def tokenize(self, text: str) -> list[str]:
        """Split ``text`` into tokens."""
        tokens: list[str] = []
        for match in _UNICODE_TOKEN_RE.finditer(text.lower()):
            word = match.group(0)
            # A word run may mix scripts ("abc中文"); split the CJK characters out of it.
            pos = 0
            for cjk in _CJK_RE.finditer(word):
                if cjk.start() > pos:
                    tokens.append(word[pos : cjk.start()])
                tokens.append(cjk.group(0))
                pos = cjk.end()
            if pos < len(word):
                tokens.append(word[pos:])
        return tokens


@functools.lru_cache(maxsize=4)
def _scorer(stem: bool, unicode: bool) -> RougeScorer:
    # Imported here: rouge_score pulls in nltk, which takes seconds to import.
    from rouge_score import rouge_scorer

    if unicode:
        return rouge_scorer.RougeScorer(["rougeL"], tokenizer=UnicodeTokenizer())
    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=stem)


def rouge_l(prediction: str, reference: str, *, stem: bool = True, unicode: bool = False) -> float:
    """Rouge-L F-measure between one prediction and one reference, in [0, 1].

    Args:
        prediction: Generated text.
        reference: Ground-truth text.
        stem: Apply the Porter stemmer to words longer than 3 characters. True follows the
            Super-NaturalInstructions / MiniLLM evaluation that FedPT reports; the
            self-instruct similarity filter of FewFedPIT uses False. Ignored when ``unicode``.
        unicode: Tokenise with :class:`UnicodeTokenizer` instead of the ASCII-only default.

    Returns:
        The F-measure of the longest common subsequence of tokens.
    """
    score = _scorer(stem, unicode).score(reference, prediction)["rougeL"]
    return float(score.fmeasure)


def rouge_l_corpus(
    predictions: Sequence[str],
    references: Sequence[str],
    *,
    stem: bool = True,
    unicode: bool = False,
) -> float:
    """Mean sentence-level Rouge-L F-measure over aligned predictions and references.

    Raises:
        DataError: The sequences are empty or of different lengths.
    """
    if len(predictions) != len(references):
        raise DataError(
            f"rouge_l_corpus got {len(predictions)} predictions but {len(references)} references",
            fix="Pass one prediction per reference, in the same order.",
        )
    if not predictions:
        raise DataError(
            "rouge_l_corpus got no predictions to score",
            fix="Generate at least one prediction before scoring the evaluation set.",
        )
    total = sum(
        rouge_l(pred, ref, stem=stem, unicode=unicode)
        for pred, ref in zip(predictions, references, strict=True)
    )
    return total / len(predictions)
