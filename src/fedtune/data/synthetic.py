"""Deterministic synthetic instruction tasks whose answers can be checked exactly.

No dataset can be downloaded on the project's machines, and federated experiments need
tenants whose data differ by *kind* of task. These generators make Dolly-format records
(``instruction``, ``context``, ``response``, ``category``) in five categories:

| category   | task                                             | response                   |
|------------|--------------------------------------------------|----------------------------|
| arithmetic | two-number word problem (add or take away)       | ``a + b = c. The answer is c.`` |
| reverse    | reverse a word (inline or given as the input)    | the reversed word          |
| lookup     | a key-value table as input; one key's value      | the value                  |
| classify   | is a word an animal, a fruit or a color?         | the class name             |
| count      | how often a letter occurs in a word              | the number                 |

Each category draws from its own ``random.Random`` seeded by ``(seed, category)``, so a
category's records do not depend on which other categories are requested, and asking for
more records extends the same sequence. Within one call, no (instruction, context) pair
repeats, and pairs listed in ``exclude`` (e.g. the training set when drawing a test set) are
never produced.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from fedtune.core.errors import ConfigError, DataError

__all__ = ["CATEGORIES", "LEXICON", "generate", "generate_mixture", "mixture_counts"]

Record = dict[str, str]
_Task = tuple[str, str, str]  # instruction, context, response

_NAMES: Final = ("Ada", "Ben", "Cleo", "Dan", "Eva", "Finn", "Gia", "Hugo", "Ivy", "Jon")
_ITEMS: Final = ("apples", "books", "coins", "pencils", "stamps", "marbles", "cards", "shells")

LEXICON: Final[dict[str, tuple[str, ...]]] = {
    "animal": (
        "cat",
        "dog",
        "horse",
        "tiger",
        "rabbit",
        "eagle",
        "whale",
        "mouse",
        "sheep",
        "zebra",
        "otter",
        "camel",
        "goat",
        "lion",
        "frog",
    ),
    "fruit": (
        "apple",
        "banana",
        "cherry",
        "grape",
        "lemon",
        "mango",
        "peach",
        "pear",
        "plum",
        "kiwi",
        "melon",
        "orange",
        "papaya",
        "lime",
        "fig",
    ),
    "color": (
        "red",
        "blue",
        "green",
        "yellow",
        "purple",
        "black",
        "white",
        "brown",
        "pink",
        "gray",
        "violet",
        "cyan",
        "magenta",
        "teal",
        "indigo",
    ),
}
_CLASSIFY_QUESTIONS: Final = (
    "Is '{word}' an animal, a fruit or a color?",
    "Which group does the word '{word}' belong to: animal, fruit or color?",
    "Answer with animal, fruit or color: what is '{word}'?",
)


def _word(rng: random.Random, low: int, high: int, letters: str = string.ascii_lowercase) -> str:
    return "".join(rng.choice(letters) for _ in range(rng.randint(low, high)))


def _arithmetic(rng: random.Random) -> _Task:
    name, items = rng.choice(_NAMES), rng.choice(_ITEMS)
    if rng.random() < 0.5:
        a, b = rng.randint(2, 50), rng.randint(1, 50)
        question = (
            f"{name} has {a} {items} and gets {b} more. How many {items} does {name} have now?"
        )
        return question, "", f"{a} + {b} = {a + b}. The answer is {a + b}."
    a = rng.randint(10, 60)
    b = rng.randint(1, a - 1)
    question = f"{name} has {a} {items} and gives away {b}. How many {items} does {name} have left?"
    return question, "", f"{a} - {b} = {a - b}. The answer is {a - b}."


def _reverse(rng: random.Random) -> _Task:
    word = _word(rng, 3, 7)
    if rng.random() < 0.5:
        return "Reverse the letters of the given word.", word, word[::-1]
    return f"Reverse the letters of the word '{word}'.", "", word[::-1]


def _lookup(rng: random.Random) -> _Task:
    size = rng.randint(3, 5)
    keys: list[str] = []
    while len(keys) < size:
        key = _word(rng, 3, 3)
        if key not in keys:
            keys.append(key)
    values = [rng.randint(10, 99) for _ in keys]
    target = rng.randrange(len(keys))
    table = "\n".join(f"{key}: {value}" for key, value in zip(keys, values, strict=True))
    return f"What is the value of '{keys[target]}' in the table?", table, str(values[target])


def _classify(rng: random.Random) -> _Task:
    label = rng.choice(sorted(LEXICON))
    word = rng.choice(LEXICON[label])
    if rng.random() < 0.25:
        return "Classify the word as an animal, a fruit or a color.", word, label
    return rng.choice(_CLASSIFY_QUESTIONS).format(word=word), "", label


def _count(rng: random.Random) -> _Task:
    # A small alphabet makes repeated letters (counts of 2-3) common, not just 0 or 1.
    word = _word(rng, 5, 9, letters="abcdef")
    letter = rng.choice(word) if rng.random() < 0.8 else rng.choice("abcdef")
    question = f"How many times does the letter '{letter}' appear in the word '{word}'?"
    return question, "", str(word.count(letter))


_GENERATORS: Final[dict[str, Callable[[random.Random], _Task]]] = {
    "arithmetic": _arithmetic,
    "reverse": _reverse,
    "lookup": _lookup,
    "classify": _classify,
    "count": _count,
}
CATEGORIES: Final[tuple[str, ...]] = tuple(_GENERATORS)

# Draw attempts per requested record before concluding the category has run out of
# distinct items (classify has only a few hundred).
_ATTEMPTS_PER_RECORD: Final = 50


def _check_category(category: str) -> None:
    if category not in _GENERATORS:
        raise ConfigError(
            f"unknown synthetic category {category!r}",
            fix=f"Use some of: {', '.join(CATEGORIES)}.",
        )


def _category_records(category: str, n: int, seed: int, seen: set[tuple[str, str]]) -> list[Record]:
    rng = random.Random(f"fedtune-synthetic:{seed}:{category}")
    records: list[Record] = []
    for _ in range(n * _ATTEMPTS_PER_RECORD):
        if len(records) == n:
            break
        instruction, context, response = _GENERATORS[category](rng)
        if (instruction, context) in seen:
            continue
        seen.add((instruction, context))
        records.append(
            {
                "instruction": instruction,
                "context": context,
                "response": response,
                "category": category,
            }
        )
    if len(records) < n:
        raise DataError(
            f"synthetic category {category!r} produced only {len(records)} distinct records "
            f"of the {n} requested (seed {seed})",
            fix="Request fewer records of this category or exclude fewer records.",
        )
    return records


def generate(
    n_per_category: int | Mapping[str, int],
    categories: list[str] | None = None,
    seed: int = 0,
    *,
    exclude: Iterable[Mapping[str, str]] = (),
) -> list[Record]:
    """Generate Dolly-format records, shuffled (deterministically) across categories.

    Args:
        n_per_category: Records per category, or ``{category: count}`` for a mixture.
        categories: Which categories (default: all of :data:`CATEGORIES`); must be ``None``
            when ``n_per_category`` is a mapping.
        seed: The seed; the same arguments always give the same records in the same order.
        exclude: Records whose (instruction, context) must not be produced again.

    Raises:
        ConfigError: On an unknown category, a negative count, or both a mapping and
            ``categories``.
        DataError: If a category cannot produce enough distinct records.
    """
    if isinstance(n_per_category, Mapping):
        if categories is not None:
            raise ConfigError(
                "pass either per-category counts or a list of categories, not both",
                fix="Drop `categories` when n_per_category is a mapping.",
            )
        counts = dict(n_per_category)
    else:
        counts = {c: n_per_category for c in (CATEGORIES if categories is None else categories)}
    for category, n in counts.items():
        _check_category(category)
        if n < 0:
            raise ConfigError(
                f"negative record count {n} for category {category!r}", fix="Use counts >= 0."
            )
    seen = {(r["instruction"], r.get("context", "")) for r in exclude}
    records = [r for c, n in counts.items() for r in _category_records(c, n, seed, seen)]
    random.Random(f"fedtune-synthetic:{seed}:order").shuffle(records)
    return records


def mixture_counts(total: int, weights: Mapping[str, float]) -> dict[str, int]:
    """Split ``total`` records by category weights (largest remainders; sums to ``total``).

    Raises:
        ConfigError: On an unknown category, a negative weight, or weights summing to zero.
    """
    for category, weight in weights.items():
        _check_category(category)
        if weight < 0:
            raise ConfigError(
                f"negative mixture weight {weight} for {category!r}", fix="Use weights >= 0."
            )
    weight_sum = sum(weights.values())
    if total < 0 or weight_sum <= 0:
        raise ConfigError(
            f"cannot split {total} records by weights {dict(weights)}",
            fix="Use total >= 0 and at least one positive weight.",
        )
    exact = {c: total * w / weight_sum for c, w in weights.items()}
    counts = {c: int(x) for c, x in exact.items()}
    by_remainder = sorted(weights, key=lambda c: (-(exact[c] - counts[c]), list(weights).index(c)))
    for category in by_remainder[: total - sum(counts.values())]:
        counts[category] += 1
    return counts


def generate_mixture(
    total: int,
    weights: Mapping[str, float],
    seed: int = 0,
    *,
    exclude: Iterable[Mapping[str, str]] = (),
) -> list[Record]:
    """``total`` records with categories in proportion to ``weights`` (see :func:`generate`)."""
    return generate(mixture_counts(total, weights), seed=seed, exclude=exclude)
