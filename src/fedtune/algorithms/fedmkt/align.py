"""Token alignment of one text tokenized two ways, and top-k mapping onto the receiver (paper
003, Appendix "Implementation Details of Token Alignment": tokenization and alignment, logits
mapping).

:func:`align_tokens` finds the cheapest path through the two token sequences by dynamic
programming. Moves: one-to-one (cost: edit distance of the two texts), many-to-one (several
sender tokens against one receiver token, cost: edit distance of their concatenation), one-to-
many (the reverse), and skipping a token (cost: its length). Texts are compared without
word-boundary markers, so ``we`` matches ``▁we``. The path is searched in a band of
``band`` characters around the diagonal of the two texts' character offsets (the texts are
the same, so the optimum never strays far), which makes it linear in the sequence length.

Which receiver positions get the sender's knowledge follows the appendix: a receiver token
matched one-to-one takes its sender token's top-k; in a many-to-one group (``util`` + ``ize``
against ``utilize``) it takes the first sender token's ("we consider 'utilize' as a match for
'util'"); a receiver token without a unique match (one-to-many, skipped) gets a one-hot of
itself. Knowledge rows are indexed by the token they predict, so pairing target tokens pairs
the distributions that predict them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedtune.algorithms.fedmkt.vocab import BOUNDARY

MAX_GROUP = 6  # tokens of one side a single token of the other may span
_INF = float("inf")


def _bare(text: str | None) -> str:
    return (text or "").replace(BOUNDARY, "").strip()


def align_tokens(
    src_tokens: Sequence[str | None], dst_tokens: Sequence[str | None], band: int = 24
) -> list[tuple[int, int]]:
    """``(src_position, dst_position)`` pairs: one-to-one matches and, for a many-to-one
    group, its first sender token with the receiver token. Receiver positions absent from the
    result have no unique match.

    Args:
        src_tokens: The sender's canonical token texts (:func:`~.vocab.canonical_tokens`).
        dst_tokens: The receiver's, of the same text.
        band: Character slack around the diagonal the search may use.
    """
    from rapidfuzz.distance import Levenshtein

    a = [_bare(t) for t in src_tokens]
    b = [_bare(t) for t in dst_tokens]
    n, m = len(a), len(b)
    ca = np.concatenate([[0], np.cumsum([len(t) for t in a])])
    cb = np.concatenate([[0], np.cumsum([len(t) for t in b])])
    slack = band + abs(int(ca[-1]) - int(cb[-1]))
    cost = np.full((n + 1, m + 1), _INF)
    move: dict[tuple[int, int], tuple[int, int]] = {}
    cost[0, 0] = 0.0
    for i in range(n + 1):
        lo = int(np.searchsorted(cb, ca[i] - slack, side="left"))
        hi = int(np.searchsorted(cb, ca[i] + slack, side="right"))
        for j in range(max(lo, 0), min(hi, m + 1)):
            if i == 0 and j == 0:
                continue
            best, step = _INF, (0, 0)
            # Order sets the preference on ties: one-to-one, many-to-one, one-to-many, skips.
            candidates: list[tuple[int, int, float]] = []
            if i and j:
                for g in range(1, min(MAX_GROUP, i) + 1):
                    candidates.append((g, 1, Levenshtein.distance("".join(a[i - g : i]), b[j - 1])))
                for g in range(2, min(MAX_GROUP, j) + 1):
                    candidates.append((1, g, Levenshtein.distance(a[i - 1], "".join(b[j - g : j]))))
            if i:
                candidates.append((1, 0, float(len(a[i - 1]) or 1)))
            if j:
                candidates.append((0, 1, float(len(b[j - 1]) or 1)))
            for di, dj, c in candidates:
                total = cost[i - di, j - dj] + c
                if total < best:
                    best, step = total, (di, dj)
            cost[i, j] = best
            move[(i, j)] = step
    pairs: list[tuple[int, int]] = []
    i, j = n, m
    while (i, j) != (0, 0):
        di, dj = move[(i, j)]
        if di and dj == 1:
            pairs.append((i - di, j - 1))
        i, j = i - di, j - dj
    return pairs[::-1]


def receiver_sources(pairs: Sequence[tuple[int, int]], n_dst: int) -> np.ndarray:
    """Per receiver position, the sender position whose knowledge it takes, or -1."""
    out = np.full(n_dst, -1, dtype=np.int64)
    for src, dst in pairs:
        out[dst] = src
    return out


def map_topk(
    topk_ids: np.ndarray, topk_logprobs: np.ndarray, table: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Sender top-k ids mapped through the vocabulary table onto receiver ids.

    Where several sender tokens land on one receiver token, the first (highest-ranked) keeps
    its value and the rest become ``-inf`` (the appendix: "if it has not been assigned a value
    before, copy"). Shapes (P, k) in and out.
    """
    mapped = table[topk_ids.astype(np.int64)]
    values = topk_logprobs.astype(np.float32).copy()
    order = np.argsort(mapped, axis=1, kind="stable")
    ranked = np.take_along_axis(mapped, order, axis=1)
    repeat = np.zeros_like(ranked, dtype=bool)
    repeat[:, 1:] = ranked[:, 1:] == ranked[:, :-1]
    dup = np.zeros_like(repeat)
    np.put_along_axis(dup, order, repeat, axis=1)
    values[dup] = -np.inf
    return mapped, values


def one_hot(token_ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k rows that put all mass on each receiver token itself (shape (P, k))."""
    ids = np.zeros((len(token_ids), k), dtype=np.int64)
    ids[:, 0] = token_ids
    values = np.full((len(token_ids), k), -np.inf, dtype=np.float32)
    values[:, 0] = 0.0
    return ids, values
