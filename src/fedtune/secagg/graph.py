"""The communication graph of SecAgg+ (Bell et al. 2020, "Secure Single-Server Aggregation
with (Poly)Logarithmic Overhead", section 3): a k-regular Harary graph H(n, k) whose nodes
are the sampled tenants in an order drawn from a public seed.

H(n, k) for even k joins each node to the k/2 nodes on either side of it on a ring; with the
random assignment of tenants to ring positions it is the graph the paper's semi-honest
construction uses. Tenants mask and share only with their neighbours; k = n - 1 is the
complete graph of Bonawitz et al. 2017. Every party derives the graph itself from the
sampled names, k and the seed, so the provider that routes the messages cannot pick edges.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping

Graph = dict[str, frozenset[str]]


def auto_degree(n: int) -> int:
    """``neighbours: auto``: the even k nearest above 2 * ceil(log2 n), at most n - 1 (O(log n))."""
    if n <= 1:
        return 0
    k = 2 * math.ceil(math.log2(n))
    return min(k, n - 1)


def degree(setting: int | str, n: int) -> int:
    """Neighbours per tenant for a ``secure_aggregation.neighbours`` setting and n tenants."""
    if setting == "all":
        return n - 1
    if setting == "auto":
        return auto_degree(n)
    return min(int(setting), n - 1)


def _order(names: list[str], seed: bytes) -> list[str]:
    """The ring: names sorted by a keyed hash (a permutation only the seed decides)."""
    return sorted(names, key=lambda n: hashlib.sha256(seed + b"|" + n.encode()).digest())


def harary(names: Iterable[str], k: int, seed: bytes) -> Graph:
    """Neighbours of each name in H(n, k) over the seeded ring (k even; k >= n - 1: complete)."""
    ring = _order(sorted(set(names)), seed)
    n = len(ring)
    if k >= n - 1:
        return {u: frozenset(ring) - {u} for u in ring}
    if k % 2:
        raise ValueError(f"a Harary graph of n={n} tenants needs an even degree below n - 1, got {k}")
    half = k // 2
    return {
        u: frozenset(ring[(i + d) % n] for d in range(-half, half + 1) if d) for i, u in enumerate(ring)
    }


def components(graph: Mapping[str, frozenset[str]], nodes: Iterable[str]) -> list[list[str]]:
    """Connected components of the subgraph induced by ``nodes`` (sorted lists)."""
    left = set(nodes)
    out: list[list[str]] = []
    while left:
        start = min(left)
        seen, todo = {start}, [start]
        while todo:
            u = todo.pop()
            for v in graph.get(u, frozenset()) & left:
                if v not in seen:
                    seen.add(v)
                    todo.append(v)
        left -= seen
        out.append(sorted(seen))
    return sorted(out)
