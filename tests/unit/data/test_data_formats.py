"""Record formats: Alpaca, Dolly, GSM8K normalised into Example; errors name file and line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedtune.core.errors import DataError
from fedtune.data.formats import Example, detect_format, load_examples, to_example
from fedtune.data.jsonl import write_jsonl

GSM8K_ANSWER = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)

CASES: list[tuple[str, dict[str, Any], Example]] = [
    (
        "alpaca-with-input",
        {"instruction": "Translate.", "input": "Hallo", "output": "Hello"},
        Example("Translate.", "Hallo", "Hello", None),
    ),
    (
        "alpaca-without-input-key",
        {"instruction": "Say hi.", "output": "Hi"},
        Example("Say hi.", "", "Hi", None),
    ),
    (
        "alpaca-null-input",
        {"instruction": "Say hi.", "input": None, "output": "Hi"},
        Example("Say hi.", "", "Hi", None),
    ),
    (
        "dolly-with-context",
        {
            "instruction": "Who?",
            "context": "Ada wrote it.",
            "response": "Ada",
            "category": "closed_qa",
        },
        Example("Who?", "Ada wrote it.", "Ada", "closed_qa"),
    ),
    (
        "dolly-empty-context",
        {"instruction": "Name a fruit.", "context": "", "response": "Fig", "category": "open_qa"},
        Example("Name a fruit.", "", "Fig", "open_qa"),
    ),
    (
        "gsm8k-rewrite",
        {"question": "How many clips?", "answer": GSM8K_ANSWER},
        Example(
            "How many clips?",
            "",
            "Natalia sold 48/2 = 24 clips in May.\n"
            "Natalia sold 48+24 = 72 clips altogether in April and May.\nThe answer is 72",
            None,
        ),
    ),
    (
        "gsm8k-answer-only",
        {"question": "2+2?", "answer": "#### 4"},
        Example("2+2?", "", "The answer is 4", None),
    ),
    (
        "gsm8k-comma-number-trailing-newline",
        {"question": "Big?", "answer": "It is big.\n#### 1,000\n"},
        Example("Big?", "", "It is big.\nThe answer is 1,000", None),
    ),
]


@pytest.mark.parametrize(("record", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_records_normalise_to_examples(record: dict[str, Any], expected: Example) -> None:
    assert to_example(record) == expected


def test_example_is_frozen() -> None:
    example = Example("a", "", "b", None)
    with pytest.raises(AttributeError):
        example.response = "c"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        (("instruction", "input", "output"), "alpaca"),
        (("instruction", "output"), "alpaca"),
        (("instruction", "context", "response", "category"), "dolly"),
        (("instruction", "response"), "dolly"),
        (("question", "answer"), "gsm8k"),
        # Incomplete records still map to the format they resemble most, so the field check
        # can say precisely what is missing.
        (("instruction", "context"), "dolly"),
        (("question",), "gsm8k"),
    ],
)
def test_detect_format_from_keys(keys: tuple[str, ...], expected: str) -> None:
    assert detect_format(dict.fromkeys(keys, "x")) == expected


def test_explicit_format_overrides_detection() -> None:
    record = {"instruction": "i", "input": "ctx", "output": "alpaca out", "response": "dolly out"}
    assert to_example(record, "alpaca").response == "alpaca out"
    assert to_example(record, "dolly").response == "dolly out"


def test_missing_field_error_names_file_line_missing_and_present(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_bytes(
        write_jsonl(
            [
                {"instruction": "a", "context": "", "response": "b", "category": "c"},
                {"instruction": "a", "context": "", "response": "b", "category": "c"},
            ]
        )
        + b"\n"  # a blank line must not shift the reported line number
        + write_jsonl([{"instruction": "x", "context": "y", "category": "c"}])
    )
    with pytest.raises(DataError) as info:
        load_examples(path)
    message = str(info.value)
    assert str(path) in message
    assert "line 4" in message
    assert "missing required field(s) response" in message
    assert "fields present: category, context, instruction" in message
    assert info.value.fix and info.value.exit_code == 3


def test_format_is_fixed_by_the_first_record() -> None:
    # The second record has Alpaca keys in a Dolly file: reported, not silently re-read.
    data = write_jsonl(
        [
            {"instruction": "a", "response": "b"},
            {"instruction": "a", "output": "b"},
        ]
    )
    with pytest.raises(DataError, match=r"s3://b/t\.jsonl, line 2: dolly record is missing"):
        load_examples(data, source="s3://b/t.jsonl")


def test_forced_format_reports_its_own_missing_fields() -> None:
    with pytest.raises(DataError, match=r"gsm8k record is missing required field\(s\) question, "):
        load_examples(write_jsonl([{"instruction": "a", "output": "b"}]), "f.jsonl", "gsm8k")


@pytest.mark.parametrize(
    ("record", "fmt", "pattern"),
    [
        (
            {"text": "hello"},
            None,
            r"d\.jsonl, line 7: cannot tell the record format; "
            r"fields present: text",
        ),
        ({"instruction": 3, "output": "b"}, None, r"field 'instruction' must be a string, got int"),
        ({"question": "q", "answer": "no final line"}, None, r"no final '#### N' line"),
        ({"instruction": "a", "output": "b"}, "csv", r"unknown record format 'csv' for d\.jsonl"),
    ],
    ids=["unknown-keys", "non-string", "gsm8k-without-final", "unknown-format"],
)
def test_bad_records_raise_data_error(record: dict[str, Any], fmt: Any, pattern: str) -> None:
    with pytest.raises(DataError, match=pattern):
        to_example(record, fmt, source="d.jsonl", line=7)


def test_empty_dataset_is_an_error() -> None:
    with pytest.raises(DataError, match="holds no records"):
        load_examples(b"\n\n", source="empty.jsonl")


def test_load_examples_reads_every_record(tmp_path: Path) -> None:
    records = [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(3)]
    path = tmp_path / "gsm.jsonl"
    path.write_bytes(write_jsonl(records))
    examples = load_examples(str(path))
    assert [e.response for e in examples] == [
        "The answer is 0",
        "The answer is 1",
        "The answer is 2",
    ]
