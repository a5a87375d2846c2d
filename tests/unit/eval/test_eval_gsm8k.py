"""GSM-8K answer extraction and exact match on realistic generations."""

from __future__ import annotations

import pytest

from fedtune.core.errors import DataError
from fedtune.eval.gsm8k import (
    exact_match,
    extract_answer,
    gsm8k_accuracy,
    normalize_number,
    reference_answer,
)

EXTRACTION = [
    # (name, generated continuation, expected)
    ("paper format", "There are 15 trees originally. So $21 - 15 = 6$. The answer is 6.", "6"),
    (
        "keeps going with an invented demo",
        (
            "Leah had 32 + 42 = 74. The answer is 39.\n\nInstruction:\nTom has 3 apples."
            "\n\nResponse:\nThe answer is 3."
        ),
        "39",
    ),
    ("thousands commas", "In total 1,250 + 750 = 2,000. The answer is 2,000.", "2000"),
    ("dollars and cents", "She pays 3 * $6 = $18. The answer is $18.00.", "18"),
    ("negative", "The temperature drops 5 below zero. The answer is -5.", "-5"),
    ("negative dollars", "He loses money. The answer is -$12.", "-12"),
    ("decimal", "Each costs 7 / 2 = 3.5 dollars. The answer is 3.5", "3.5"),
    ("trailing zeros", "The answer is 0.50.", "0.5"),
    ("gsm8k marker", "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72", "72"),
    ("final answer phrase", "So the final answer is: 1,000,000", "1000000"),
    ("bold and colon", "The answer is: **18** eggs.", "18"),
    ("percent", "The answer is 25%.", "25"),
    ("lower case trigger", "the answer is 9", "9"),
    ("no trigger: last number", "5 + 4 = 9 toys, then 9 + 20 = 29", "29"),
    ("operator minus is not a sign", "We have 5 - 3", "3"),
    ("answer without a number", "The answer is unknown.\nThe answer is 4.", None),
    ("number after the answer sentence", "The answer is unclear. Maybe 72 apples.", None),
    ("answer on the next line", "The answer is\n72\nInstruction: 5 cars", "72"),
    ("nothing numeric", "I cannot solve this problem.", None),
    ("empty", "", None),
]


@pytest.mark.parametrize(
    ("text", "expected"), [(t, e) for _, t, e in EXTRACTION], ids=[n for n, _, _ in EXTRACTION]
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1,234", "1234"),
        ("$18.00", "18"),
        ("18.", "18"),
        ("-0", "0"),
        ("0.250", "0.25"),
        ("1e3", "1000"),
        ("50%", "50"),
        ("abc", None),
        ("", None),
        ("nan", None),
    ],
)
def test_normalize_number(raw: str, expected: str | None) -> None:
    assert normalize_number(raw) == expected


GSM8K_REFERENCE = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)


@pytest.mark.parametrize(
    ("prediction", "reference", "expected"),
    [
        ("She sold 48 + 24 = 72 clips. The answer is 72.", GSM8K_REFERENCE, True),
        ("She sold 48 + 24 = 72 clips. The answer is 72.", "72", True),
        ("The answer is 72.0", "The answer is 72.", True),
        ("The answer is $1,000.", "#### 1000", True),
        ("She sold 48 clips. The answer is 48.", GSM8K_REFERENCE, False),
        ("The answer is unclear. 72", GSM8K_REFERENCE, False),
        ("", "72", False),
    ],
)
def test_exact_match(prediction: str, reference: str, expected: bool) -> None:
    assert exact_match(prediction, reference) is expected


def test_reference_without_a_number_is_a_data_error() -> None:
    with pytest.raises(DataError, match="contains no number") as info:
        reference_answer("no answer here")
    assert "####" in info.value.fix


def test_accuracy_counts_matches() -> None:
    preds = ["The answer is 6.", "The answer is 5.", "The answer is 40."]
    assert gsm8k_accuracy(preds, ["#### 6", "#### 5", "#### 39"]) == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    ("preds", "refs", "message"),
    [(["The answer is 1."], ["1", "2"], "1 predictions but 2"), ([], [], "no predictions")],
)
def test_accuracy_rejects_bad_inputs(preds: list[str], refs: list[str], message: str) -> None:
    with pytest.raises(DataError, match=message):
        gsm8k_accuracy(preds, refs)
