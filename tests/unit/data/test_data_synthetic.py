"""Synthetic tasks: determinism, exact answers recomputed independently, mixtures, errors."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from fedtune.core.errors import ConfigError, DataError
from fedtune.data.formats import to_example
from fedtune.data.synthetic import CATEGORIES, LEXICON, generate, generate_mixture, mixture_counts


def _expected(record: dict[str, str]) -> str:
    """Recompute a record's answer from its text alone."""
    instruction, context = record["instruction"], record["context"]
    category = record["category"]
    if category == "arithmetic":
        match = re.fullmatch(
            r"(\w+) has (\d+) (\w+) and (gets|gives away) (\d+)( more)?\. How many \3 does \1 "
            r"have (now|left)\?",
            instruction,
        )
        assert match, instruction
        a, b = int(match.group(2)), int(match.group(5))
        if match.group(4) == "gets":
            return f"{a} + {b} = {a + b}. The answer is {a + b}."
        return f"{a} - {b} = {a - b}. The answer is {a - b}."
    if category == "reverse":
        word = context or re.fullmatch(r"Reverse the letters of the word '(\w+)'\.", instruction)[1]
        return word[::-1]
    if category == "lookup":
        key = re.fullmatch(r"What is the value of '(\w+)' in the table\?", instruction)[1]
        table = dict(line.split(": ") for line in context.splitlines())
        return table[key]
    if category == "classify":
        word = context or re.search(r"'(\w+)'", instruction)[1]
        return next(label for label, words in LEXICON.items() if word in words)
    if category == "count":
        letter, word = re.fullmatch(
            r"How many times does the letter '(\w)' appear in the word '(\w+)'\?", instruction
        ).groups()
        return str(word.count(letter))
    raise AssertionError(category)


def test_every_answer_is_correct_and_records_are_dolly() -> None:
    records = generate(100, seed=5)
    assert Counter(r["category"] for r in records) == dict.fromkeys(CATEGORIES, 100)
    for record in records:
        assert list(record) == ["instruction", "context", "response", "category"]
        assert record["response"] == _expected(record), record
        assert to_example(record).category == record["category"]


def test_arithmetic_ends_like_gsm8k_and_subtraction_stays_positive() -> None:
    for record in generate(200, ["arithmetic"], seed=1):
        value = int(record["response"].rsplit("The answer is ", 1)[1].rstrip("."))
        assert value > 0


def test_deterministic_and_seed_sensitive() -> None:
    assert generate(20, seed=3) == generate(20, seed=3)
    assert generate(20, seed=3) != generate(20, seed=4)


def test_a_category_does_not_depend_on_the_others_requested() -> None:
    alone = generate(15, ["lookup"], seed=9)
    together = [r for r in generate(15, seed=9) if r["category"] == "lookup"]
    assert sorted(map(str, alone)) == sorted(map(str, together))


def test_no_repeats_within_a_call_and_exclude_is_respected() -> None:
    first = generate(60, seed=0)
    pairs = [(r["instruction"], r["context"]) for r in first]
    assert len(pairs) == len(set(pairs))
    second = generate(60, seed=1, exclude=first)
    assert not set(pairs) & {(r["instruction"], r["context"]) for r in second}


def test_mixture_counts_follow_weights_and_sum_to_total() -> None:
    counts = mixture_counts(101, {"arithmetic": 0.5, "reverse": 0.25, "count": 0.25})
    assert counts == {"arithmetic": 51, "reverse": 25, "count": 25}
    assert sum(mixture_counts(7, dict.fromkeys(CATEGORIES, 1.0)).values()) == 7
    records = generate_mixture(50, {"classify": 3, "lookup": 1}, seed=2)
    # 37.5 / 12.5: equal remainders go to the category listed first.
    assert Counter(r["category"] for r in records) == {"classify": 38, "lookup": 12}


@pytest.mark.parametrize(
    ("call", "error", "pattern"),
    [
        (lambda: generate(3, ["poetry"]), ConfigError, "unknown synthetic category 'poetry'"),
        (lambda: generate(-1), ConfigError, "negative record count -1"),
        (lambda: generate({"count": 2}, ["count"]), ConfigError, "not both"),
        (lambda: mixture_counts(10, {"count": -1.0}), ConfigError, "negative mixture weight"),
        (lambda: mixture_counts(10, {"count": 0.0}), ConfigError, "cannot split 10 records"),
        (lambda: generate(1000, ["classify"]), DataError, "produced only \\d+ distinct records"),
    ],
    ids=["unknown", "negative", "mapping-and-list", "negative-weight", "zero-weights", "exhausted"],
)
def test_errors(call, error: type, pattern: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=pattern):
        call()
