"""The SecAgg+ communication graph: k-regular, symmetric, fixed by its seed, O(log n)."""

from __future__ import annotations

import pytest

from fedtune.secagg import graph

NAMES = [f"t{i:02d}" for i in range(20)]


@pytest.mark.parametrize("k", [2, 4, 6, 18])
def test_harary_graph_is_k_regular_symmetric_and_connected(k: int) -> None:
    g = graph.harary(NAMES, k, b"seed")
    assert sorted(g) == NAMES
    assert all(len(n) == k and u not in n for u, n in g.items())
    assert all(u in g[v] for u, n in g.items() for v in n)
    assert graph.components(g, NAMES) == [NAMES]


def test_the_seed_alone_decides_the_graph() -> None:
    assert graph.harary(NAMES, 4, b"a") == graph.harary(list(reversed(NAMES)), 4, b"a")
    assert graph.harary(NAMES, 4, b"a") != graph.harary(NAMES, 4, b"b")


def test_complete_when_k_reaches_n_minus_1_and_odd_degree_is_refused() -> None:
    g = graph.harary(NAMES[:5], 4, b"s")
    assert all(len(n) == 4 for n in g.values())
    assert graph.harary(NAMES[:5], 10, b"s") == g
    with pytest.raises(ValueError, match="even degree"):
        graph.harary(NAMES, 3, b"s")


@pytest.mark.parametrize(("n", "k"), [(2, 1), (3, 2), (8, 6), (16, 8), (100, 14), (1000, 20)])
def test_auto_degree_grows_as_log_n(n: int, k: int) -> None:
    assert graph.degree("auto", n) == k
    assert graph.degree("all", n) == n - 1
    assert graph.degree(4, n) == min(4, n - 1)


def test_components_of_an_induced_subgraph() -> None:
    g = graph.harary(NAMES[:8], 2, b"s")  # a ring
    ring = graph._order(NAMES[:8], b"s")
    cut = [ring[0], ring[1], ring[4], ring[5]]
    assert graph.components(g, cut) == sorted([sorted(ring[0:2]), sorted(ring[4:6])])
