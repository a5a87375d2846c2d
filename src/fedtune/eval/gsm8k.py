"""GSM-8K exact match on chain-of-thought generations (FedBiOT, Appendix D.2).

The 8-shot prompt of FedBiOT ends every demonstration with ``The answer is N.``, and the
reference rewrites GSM-8K's ``#### N`` into that phrase, so a model states its answer the same
way. Pass only the *generated continuation* to :func:`extract_answer`, never the prompt: the
prompt's demonstrations contain eight answers of their own.

Which answer counts: the **first** answer phrase in the continuation. A model that has stated
its answer usually keeps going and invents the next demonstration ("Instruction: ... The answer
is 7."), so later phrases belong to made-up questions; this matches the chain-of-thought-hub
evaluation the FedBiOT reference uses. The number is the first one in the rest of that
sentence (up to a newline or a sentence-ending ``.``, ``!`` or ``?``); if it holds none, the
generation has no answer (None) rather than a number borrowed from what follows. Only when no answer phrase exists at all does the last number of
the text count, as in the reference.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation

from fedtune.core.errors import DataError

# "The answer is", "the final answer is", and GSM-8K's own "####" marker.
_TRIGGER_RE = re.compile(r"(?:\bthe\s+(?:final\s+)?answer\s+is\b\s*:?|####)", re.IGNORECASE)
# A number with an optional sign and dollar sign on either side of the sign ("-$5", "$-5"),
# thousands separators only in groups of three ("1,234,567"), and an optional decimal part.
# A trailing period ("18.") is not part of the number because a digit must follow the point.
# The sign must touch the number: in "5 - 3" the minus is an operator, not part of "3".
_NUMBER_RE = re.compile(
    r"(?<![\w.])(?P<sign>-)?\$?(?P<sign2>-)?"
    r"(?P<digits>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
)

# End of the sentence that states the answer: a newline, or ". " / "!" / "?" before a space or
# the end ("3.5" and "$18.00" keep their points because a digit follows).
_SENTENCE_END_RE = re.compile(r"\n|[.!?](?=\s|$)")


def normalize_number(text: str) -> str | None:
    """Canonical string of a number written as in GSM-8K answers.

    Removes ``$``, ``%``, thousands commas, spaces and a trailing period; ``"18.00"`` and
    ``"18"`` both become ``"18"``, ``"-0"`` becomes ``"0"``, ``"0.50"`` becomes ``"0.5"``.

    Returns:
        The canonical form, or None when ``text`` is not a number.
    """
    cleaned = text.strip().replace(",", "").replace("$", "").replace(" ", "").rstrip("%")
    cleaned = cleaned.rstrip(".")
    if not cleaned:
        return None
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    if value == value.to_integral_value():
        return str(int(value))
    # normalize() drops trailing zeros; format "f" avoids the exponent notation it can produce.
    return format(value.normalize(), "f")


def _number_at(match: re.Match[str]) -> str | None:
    negative = bool(match.group("sign") or match.group("sign2"))
    return normalize_number(("-" if negative else "") + match.group("digits"))


def extract_answer(text: str) -> str | None:
    """The final numeric answer stated in a generated chain-of-thought solution.

    See the module docstring for which occurrence counts.

    Args:
        text: The model's continuation (not including the prompt), or a GSM-8K answer field.

    Returns:
        The normalised number (see :func:`normalize_number`), or None when there is none.
    """
    trigger = _TRIGGER_RE.search(text)
    if trigger is not None:
        rest = text[trigger.end() :].lstrip()
        sentence = _SENTENCE_END_RE.split(rest, maxsplit=1)[0]
        match = _NUMBER_RE.search(sentence)
        return _number_at(match) if match is not None else None
    matches = list(_NUMBER_RE.finditer(text))
    return _number_at(matches[-1]) if matches else None


def reference_answer(reference: str) -> str:
    """The normalised answer of a GSM-8K reference: an ``answer`` field or a bare number.

    Raises:
        DataError: The reference holds no number.
    """
    answer = extract_answer(reference)
    if answer is None:
        shown = reference if len(reference) <= 80 else reference[:77] + "..."
        raise DataError(
            f"GSM-8K reference answer {shown!r} contains no number",
            fix="Pass the record's 'answer' field (ending in '#### N') or the bare number N.",
        )
    return answer


def exact_match(prediction_text: str, reference_answer_text: str) -> bool:
    """Whether a generation's final answer equals the reference's, as numbers.

    Args:
        prediction_text: The model's continuation.
        reference_answer_text: GSM-8K's ``answer`` field (``... #### 72``), a reference
            rewritten to ``The answer is 72.``, or the bare number.

    Raises:
        DataError: The reference holds no number.
    """
    expected = reference_answer(reference_answer_text)
    predicted = extract_answer(prediction_text)
    if predicted is None:
        return False
    return Decimal(predicted) == Decimal(expected)


def gsm8k_accuracy(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Fraction of generations whose answer matches the reference.

    Raises:
        DataError: Empty or misaligned inputs, or a reference without a number.
    """
    if len(predictions) != len(references):
        raise DataError(
            f"gsm8k_accuracy got {len(predictions)} predictions but {len(references)} references",
            fix="Pass one generation per reference, in the same order.",
        )
    if not predictions:
        raise DataError(
            "gsm8k_accuracy got no predictions to score",
            fix="Generate at least one answer before scoring the evaluation set.",
        )
    hits = sum(exact_match(p, r) for p, r in zip(predictions, references, strict=True))
    return hits / len(predictions)
