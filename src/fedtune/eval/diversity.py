"""Dist-n generation diversity (Li et al., 2016), as FedPT reports Dist-3 and Dist-4.

Dist-n = (number of distinct n-grams) / (total number of n-grams), counted over the whole set
of generated responses (FedPT, Appendix C.5). n-grams never span two responses. By default a
response is split on whitespace and kept in its case; pass ``tokenize`` to count model tokens
or lower-cased words instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fedtune.core.errors import ConfigError, DataError


def distinct_n(
    texts: Sequence[str], n: int, tokenize: Callable[[str], list[str]] = str.split
) -> float:
    """Corpus-level Dist-n of ``texts``, in [0, 1].

    Args:
        texts: Generated responses.
        n: n-gram length (FedPT reports n = 3 and 4).
        tokenize: Splits a response into tokens; whitespace split by default.

    Returns:
        Distinct over total n-grams; 0.0 when no response is at least ``n`` tokens long
        (such a set has no n-gram at all, so no diversity to credit).

    Raises:
        ConfigError: ``n`` < 1.
        DataError: ``texts`` is empty.
    """
    if n < 1:
        raise ConfigError(f"distinct_n needs n >= 1, got n={n}", fix="Use n = 3 or 4 as in FedPT.")
    if not texts:
        raise DataError(
            "distinct_n got no texts", fix="Generate responses before measuring their diversity."
        )
    seen: set[tuple[str, ...]] = set()
    total = 0
    for text in texts:
        tokens = tokenize(text)
        for start in range(len(tokens) - n + 1):
            seen.add(tuple(tokens[start : start + n]))
            total += 1
    return len(seen) / total if total else 0.0
