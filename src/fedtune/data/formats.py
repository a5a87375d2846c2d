"""Instruction-data record formats, normalised into one :class:`Example`.

Four formats are understood (the datasets of the FedBiOT / FedPT / FewFedPIT papers, and
the chat records of FlowerTune / OpenFedLLM):

| format | fields (required in bold)                                       |
|--------|-----------------------------------------------------------------|
| alpaca | **instruction**, input, **output** (category)                   |
| dolly  | **instruction**, context, **response**, category                |
| gsm8k  | **question**, **answer** (category)                             |
| chat   | **messages** (a list of ``{role, content}``), category          |

GSM8K answers end with a ``#### N`` line; it is rewritten to ``The answer is N`` so training
targets end the way the 8-shot evaluation prompt's exemplars do (FedBiOT Appendix D).
GSM8K's calculator annotations (``<<48/2=24>>``) are removed too: they are tool markup, not
language, and the exemplars never contain them. Chat records are rendered with the
tokenizer's chat template when encoded (:mod:`fedtune.data.chat`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from fedtune.core.errors import DataError
from fedtune.data.chat import Turn, parse_messages
from fedtune.data.jsonl import iter_jsonl

__all__ = [
    "FORMATS",
    "Example",
    "Format",
    "detect_format",
    "load_examples",
    "load_numbered_examples",
    "numbered_examples",
    "to_example",
]

Format = Literal["alpaca", "dolly", "gsm8k", "chat"]


@dataclass(frozen=True)
class Example:
    """One instruction-following example, whatever file format it came from.

    Attributes:
        instruction: The task or question.
        input: Extra context for the task; ``""`` when there is none.
        response: The target text the model learns to produce.
        category: The record's class (Dolly's ``category``, the synthetic task name), if any.
        messages: A chat record's turns as ``(role, content)``; ``()`` for the other formats.
            Its last user turn is ``instruction`` and its last assistant turn ``response``,
            which is what prompt-and-answer code (evaluation, audits) sees of a chat.
    """

    instruction: str
    input: str
    response: str
    category: str | None = None
    messages: tuple[Turn, ...] = ()


@dataclass(frozen=True)
class _Spec:
    required: tuple[str, ...]
    optional: tuple[str, ...]

    @property
    def fields(self) -> tuple[str, ...]:
        return self.required + self.optional


FORMATS: Final[dict[Format, _Spec]] = {
    # Order matters for auto-detection ties: the richer Dolly schema wins over Alpaca.
    "dolly": _Spec(required=("instruction", "response"), optional=("context", "category")),
    "alpaca": _Spec(required=("instruction", "output"), optional=("input", "category")),
    "gsm8k": _Spec(required=("question", "answer"), optional=("category",)),
    "chat": _Spec(required=("messages",), optional=("category",)),
}

_GSM8K_FINAL = re.compile(r"\n?[ \t]*####[ \t]*(?P<answer>[^\n]*?)\s*$")
_GSM8K_CALCULATOR = re.compile(r"<<[^<>]*>>")


def _where(source: str, line: int | None, unit: str = "line") -> str:
    return f"{source}, {unit} {line}" if line is not None else source


def _present(record: Mapping[str, Any]) -> str:
    return ", ".join(sorted(record)) or "(none)"


def detect_format(
    record: Mapping[str, Any],
    *,
    source: str = "<records>",
    line: int | None = None,
    unit: str = "line",
) -> Format:
    """Guess a record's format from its keys.

    A format whose required fields are all present wins (the one matching most keys if
    several do); otherwise the format sharing most keys with the record is returned, so the
    caller's field check can name exactly what is missing.

    Raises:
        DataError: When the keys match no known format at all.
    """
    keys = set(record)
    overlap = {name: len(keys & set(spec.fields)) for name, spec in FORMATS.items()}
    complete = [name for name, spec in FORMATS.items() if set(spec.required) <= keys]
    candidates = complete or [name for name, hits in overlap.items() if hits > 0]
    if not candidates:
        raise DataError(
            f"{_where(source, line, unit)}: cannot tell the record format; fields present: "
            f"{_present(record)}",
            fix="Use Alpaca (instruction/input/output), Dolly (instruction/context/response/"
            "category), GSM8K (question/answer) or chat (messages) fields, or set the format "
            "explicitly.",
        )
    # max() keeps the first of equal scores, i.e. the FORMATS order.
    return max(candidates, key=lambda name: overlap[name])


def _text(record: Mapping[str, Any], field: str, where: str, *, required: bool) -> str:
    value = record.get(field)
    if value is None:
        # Dolly and Alpaca dumps use null or omit empty contexts; both mean "no input".
        return ""
    if not isinstance(value, str):
        kind = "required " if required else ""
        raise DataError(
            f"{where}: {kind}field {field!r} must be a string, got "
            f"{type(value).__name__}: {str(value)[:60]!r}",
            fix=f"Store {field!r} as a JSON string.",
        )
    return value


def _gsm8k_response(answer: str, where: str) -> str:
    match = _GSM8K_FINAL.search(answer)
    if match is None or not match.group("answer"):
        raise DataError(
            f"{where}: GSM8K answer has no final '#### N' line: {answer[-60:]!r}",
            fix="End each GSM8K answer with a line '#### <number>' as in the original dataset.",
        )
    reasoning = _GSM8K_CALCULATOR.sub("", answer[: match.start()]).rstrip()
    final = f"The answer is {match.group('answer')}"
    return f"{reasoning}\n{final}" if reasoning else final


def to_example(
    record: Mapping[str, Any],
    format: Format | None = None,
    *,
    source: str = "<records>",
    line: int | None = None,
    unit: str = "line",
) -> Example:
    """Normalise one record into an :class:`Example` (see :func:`_to_example`).

    A :class:`DataError` carries ``line`` as its ``record``: that, not the record's text, is
    what a provider may learn of a tenant's bad record.
    """
    try:
        return _to_example(record, format, source=source, line=line, unit=unit)
    except DataError as exc:
        if exc.record is None:
            exc.record = line
        raise


def _to_example(
    record: Mapping[str, Any],
    format: Format | None = None,
    *,
    source: str = "<records>",
    line: int | None = None,
    unit: str = "line",
) -> Example:
    """Normalise one record into an :class:`Example`.

    Args:
        record: The parsed JSON object.
        format: ``"alpaca"``, ``"dolly"``, ``"gsm8k"`` or ``"chat"``; detected from the keys
            when ``None``.
        source: File path or store URI, for error messages.
        line: 1-based line (or row) number in ``source``, for error messages.
        unit: What ``line`` counts in messages: ``"line"`` (JSON Lines) or ``"row"``.

    Raises:
        DataError: On an unknown format, missing required fields or non-string values; the
            message names the source, the line, the missing fields and the fields present.
    """
    where = _where(source, line, unit)
    if format is None:
        format = detect_format(record, source=source, line=line, unit=unit)
    elif format not in FORMATS:
        raise DataError(
            f"unknown record format {format!r} for {source}",
            fix=f"Use one of: {', '.join(FORMATS)}.",
        )
    spec = FORMATS[format]
    missing = [name for name in spec.required if record.get(name) is None]
    if missing:
        raise DataError(
            f"{where}: {format} record is missing required field(s) {', '.join(missing)}; "
            f"fields present: {_present(record)}",
            fix=f"Add {', '.join(missing)} to the record, or set the dataset's format if "
            f"it is not {format}.",
        )
    category = _text(record, "category", where, required=False) or None
    if format == "chat":
        turns = parse_messages(record["messages"], where)
        return Example(
            instruction=next((c for r, c in reversed(turns) if r == "user"), ""),
            input="",
            response=next(c for r, c in reversed(turns) if r == "assistant"),
            category=category,
            messages=turns,
        )
    if format == "alpaca":
        return Example(
            instruction=_text(record, "instruction", where, required=True),
            input=_text(record, "input", where, required=False),
            response=_text(record, "output", where, required=True),
            category=category,
        )
    if format == "dolly":
        return Example(
            instruction=_text(record, "instruction", where, required=True),
            input=_text(record, "context", where, required=False),
            response=_text(record, "response", where, required=True),
            category=category,
        )
    return Example(
        instruction=_text(record, "question", where, required=True),
        input="",
        response=_gsm8k_response(_text(record, "answer", where, required=True), where),
        category=category,
    )


def load_examples(
    data: bytes | str | Path | Any,
    source: str | None = None,
    format: Format | None = None,
    *,
    max_record_bytes: int | None = None,
) -> list[Example]:
    """Read a JSON Lines dataset into examples.

    The format is detected once, from the first record, and then required of every record:
    a later record missing a field is reported as such instead of being read as another
    format.

    Args:
        data: File content as bytes, a local path, or a binary stream.
        source: Name used in errors (e.g. the store URI); defaults to the path.
        format: Force a format instead of detecting it.
        max_record_bytes: Skip longer lines as they are read (see ``iter_jsonl``).

    Raises:
        DataError: On any unreadable line or record (with file and line), or an empty file.
    """
    return [
        example
        for _, example in load_numbered_examples(
            data, source, format, max_record_bytes=max_record_bytes
        )
    ]


def load_numbered_examples(
    data: bytes | str | Path | Any,
    source: str | None = None,
    format: Format | None = None,
    *,
    max_record_bytes: int | None = None,
) -> list[tuple[int, Example]]:
    """Like :func:`load_examples`, each example with its line number in the file (from 1).

    Raises:
        DataError: As :func:`load_examples`.
    """
    name = source or (str(data) if isinstance(data, str | Path) else "<bytes>")
    return numbered_examples(iter_jsonl(data, name, max_record_bytes=max_record_bytes), name, format)


def numbered_examples(
    records: Iterable[tuple[int, Mapping[str, Any]]],
    name: str,
    format: Format | None = None,
    *,
    unit: str = "line",
) -> list[tuple[int, Example]]:
    """``(number, example)`` for numbered records (JSON Lines lines, or rows of a table).

    The format is detected from the first record and required of the others.

    Raises:
        DataError: On a malformed record, or when there is none.
    """
    examples: list[tuple[int, Example]] = []
    for line, record in records:
        if format is None:
            format = detect_format(record, source=name, line=line, unit=unit)
        examples.append((line, to_example(record, format, source=name, line=line, unit=unit)))
    if not examples:
        raise DataError(
            f"dataset {name} holds no records",
            fix="Give a dataset file (JSON Lines, JSON, CSV, Parquet or a save_to_disk folder) "
            "with at least one record.",
        )
    return examples
