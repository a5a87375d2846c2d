"""Token alignment of one text tokenized two ways, and top-k mapping onto the receiver (paper
003, Appendix "Implementation Details of Token Alignment": tokenization and alignment, logits
mapping).

:func:`align_tokens` finds the cheapest path through the two token sequences by dynamic
programming. Moves: one-to-one (cost: edit distance of the two texts), many-to-one (several
sender tokens against one receiver token, cost: edit distance of their concatenation), one-to-
many (the reverse), and skipping a token (cost: its length). Texts are compared without
word-boundary markers, so ``we`` matches ``▁we``, and as the bytes they stand for, so the byte
pieces of one character joined match it (:func:`~.vocab.join_texts`). The path is searched in
a band of ``band`` bytes around the diagonal of the two texts' byte offsets (the texts are
the same, so the optimum never strays far), which makes it linear in the sequence length.

Choices where the paper is silent: a token that is only a word-start marker (``▁`` alone, no
text once the marker is dropped) is skipped at cost 1 or paired with another marker; it never
joins a group or pairs with text, where it would cost nothing and turn a neighbouring exact
match into a one-to-many group. Of equally cheap paths, the one with more exact matches wins
(an inexact pairing costs 2^-20 more than its distance: ``transfer`` against ``transfer`` +
``🤖`` costs as much as skipping the emoji, and the exact pair is kept). A group has no fixed size cap: it grows while its bytes are fewer than the other token's
(one more piece would make it longer than the token it stands for), so a word of many pieces
still forms one group and takes its first piece, and the work per cell stays bounded by the
token's length.

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

from fedtune.algorithms.fedmkt.vocab import BOUNDARY, join_texts, to_bytes

_INF = float("inf")
# Added to every inexact pairing: of equally cheap paths the one with more exact matches wins
# (2^-20 keeps the integer part exact for any sequence a model reads).
_INEXACT = 2.0**-20


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
        band: Character slack (in bytes) around the diagonal the search may use.
    """
    from rapidfuzz.distance import Levenshtein

    a = [_bare(t) for t in src_tokens]
    b = [_bare(t) for t in dst_tokens]
    la = [len(to_bytes(t)) for t in a]
    lb = [len(to_bytes(t)) for t in b]
    n, m = len(a), len(b)
    ca = np.concatenate([[0], np.cumsum(la)])
    cb = np.concatenate([[0], np.cumsum(lb)])
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
                x, y = a[i - 1], b[j - 1]
                if bool(x) == bool(y):  # a marker pairs only with a marker
                    candidates.append((1, 1, Levenshtein.distance(x, y)))
                if x and y:
                    for g, text in _groups(a, la, i, lb[j - 1]):
                        candidates.append((g, 1, Levenshtein.distance(text, y)))
                    for g, text in _groups(b, lb, j, la[i - 1]):
                        candidates.append((1, g, Levenshtein.distance(x, text)))
            if i:
                candidates.append((1, 0, float(len(a[i - 1]) or 1)))
            if j:
                candidates.append((0, 1, float(len(b[j - 1]) or 1)))
            for di, dj, c in candidates:
                total = cost[i - di, j - dj] + c + (_INEXACT if c and di and dj else 0.0)
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


def _groups(texts: Sequence[str], lengths: Sequence[int], end: int, other: int) -> list[tuple[int, str]]:
    """Groups of 2+ tokens ending at ``end`` that one token of ``other`` bytes may match: a
    group grows while it is shorter than that token and meets no marker (empty text)."""
    out: list[tuple[int, str]] = []
    total = lengths[end - 1]
    for g in range(2, end + 1):
        k = end - g
        if not texts[k] or total >= other:
            break
        total += lengths[k]
        out.append((g, join_texts(texts[k:end])))
    return out


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
