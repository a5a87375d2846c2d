"""Partitioners: determinism, disjointness, sizes, (non-)IID-ness, errors; count tables."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from fedtune.core.errors import ConfigError, DataError
from fedtune.data.loader import read_records
from fedtune.data.partition import (
    by_field,
    count_table,
    dirichlet,
    iid,
    partition,
    pathological,
    write_partitions,
)

Record = dict[str, Any]
SIZES = {"alpha": 60, "beta": 50, "gamma": 40, "delta": 30, "eps": 20}


@pytest.fixture
def records() -> list[Record]:
    out: list[Record] = []
    for category, n in SIZES.items():
        start = len(out)
        out.extend({"id": start + i, "category": category} for i in range(n))
    return out


def tenants(n: int) -> list[str]:
    return [f"t{i}" for i in range(n)]


def ids(parts: dict[str, list[Record]]) -> dict[str, list[int]]:
    return {t: [r["id"] for r in rs] for t, rs in parts.items()}


def check_invariants(parts: dict[str, list[Record]], records: list[Record], names: list[str]):
    assert list(parts) == names
    assert all(parts[t] for t in names), "a tenant is empty"
    all_ids = [i for tenant_ids in ids(parts).values() for i in tenant_ids]
    assert len(all_ids) == len(set(all_ids)), "a record went to two tenants"
    assert set(all_ids) <= {r["id"] for r in records}
    for tenant_ids in ids(parts).values():
        assert tenant_ids == sorted(tenant_ids), "original order not kept"
    return all_ids


SPLITS = {
    "iid": lambda rs, ts, seed: iid(rs, ts, seed=seed),
    "pathological": lambda rs, ts, seed: pathological(rs, ts, "category", 2, seed=seed),
    "pathological-unbalanced": lambda rs, ts, seed: pathological(
        rs, ts, "category", 2, seed=seed, balance=False
    ),
    "dirichlet": lambda rs, ts, seed: dirichlet(rs, ts, "category", 0.5, seed=seed),
}


@pytest.mark.parametrize("name", list(SPLITS))
def test_seeded_splits_are_deterministic_and_disjoint(name: str, records: list[Record]) -> None:
    split = SPLITS[name]
    first = split(records, tenants(4), 7)
    check_invariants(first, records, tenants(4))
    assert ids(split(list(records), tenants(4), 7)) == ids(first)
    assert ids(split(records, tenants(4), 8)) != ids(first)


def test_iid_uses_every_record_in_near_equal_shares(records: list[Record]) -> None:
    parts = iid(records, tenants(3), seed=0)
    assert sorted(check_invariants(parts, records, tenants(3))) == list(range(200))
    sizes = [len(p) for p in parts.values()]
    assert max(sizes) - min(sizes) <= 1


def test_by_field_gives_one_value_per_tenant(records: list[Record]) -> None:
    names = ["a", "b", "c", "d", "e"]
    parts = by_field(records, names, "category")
    check_invariants(parts, records, names)
    # Sorted values map to tenants in order.
    assert {t: {r["category"] for r in rs} for t, rs in parts.items()} == {
        "a": {"alpha"},
        "b": {"beta"},
        "c": {"delta"},
        "d": {"eps"},
        "e": {"gamma"},
    }


def test_by_field_count_mismatch_names_both_numbers(records: list[Record]) -> None:
    with pytest.raises(DataError, match=r"has 5 distinct value.* but there are 3 tenants"):
        by_field(records, tenants(3), "category")


@pytest.mark.parametrize(("n_tenants", "k"), [(3, 2), (5, 2), (10, 2), (4, 3), (2, 1)])
def test_pathological_gives_k_classes_in_equal_shards(
    records: list[Record], n_tenants: int, k: int
) -> None:
    parts = pathological(records, tenants(n_tenants), "category", k, seed=3)
    check_invariants(parts, records, tenants(n_tenants))
    for rs in parts.values():
        per_class = Counter(r["category"] for r in rs)
        assert len(per_class) == k
        assert len(set(per_class.values())) == 1, f"unequal shards {per_class}"
    assert len({len(rs) for rs in parts.values()}) == 1


def test_pathological_unbalanced_uses_every_record(records: list[Record]) -> None:
    parts = pathological(records, tenants(5), "category", 2, seed=3, balance=False)
    assert sorted(check_invariants(parts, records, tenants(5))) == list(range(200))
    assert all(len({r["category"] for r in rs}) == 2 for rs in parts.values())


@pytest.mark.parametrize(
    ("k", "n_tenants", "pattern"),
    [
        (6, 3, r"1 <= k <= number of classes; got k=6 with 5 distinct"),
        (0, 3, r"got k=0"),
        (2, 60, r"fewer records than shards: \{'eps': 20\}"),
    ],
)
def test_pathological_errors(records: list[Record], k: int, n_tenants: int, pattern: str) -> None:
    with pytest.raises(DataError, match=pattern):
        pathological(records, tenants(n_tenants), "category", k)


def _mean_tv_distance(parts: dict[str, list[Record]], records: list[Record]) -> float:
    """Mean total-variation distance between each tenant's class mix and the global one."""
    total = Counter(r["category"] for r in records)
    distances = []
    for rs in parts.values():
        mine = Counter(r["category"] for r in rs)
        distances.append(0.5 * sum(abs(mine[c] / len(rs) - total[c] / len(records)) for c in total))
    return sum(distances) / len(distances)


def test_dirichlet_small_alpha_is_skewed_large_alpha_is_near_iid(records: list[Record]) -> None:
    skewed = dirichlet(records, tenants(4), "category", 0.1, seed=0)
    even = dirichlet(records, tenants(4), "category", 1000.0, seed=0)
    for parts in (skewed, even):
        assert sorted(check_invariants(parts, records, tenants(4))) == list(range(200))
    assert _mean_tv_distance(skewed, records) > 0.3
    assert _mean_tv_distance(even, records) < 0.1
    # Sampling noise alone puts a uniform split of 50 records per tenant near 0.1.
    assert _mean_tv_distance(iid(records, tenants(4), seed=0), records) < 0.15


def test_dirichlet_errors(records: list[Record]) -> None:
    with pytest.raises(DataError, match="alpha must be > 0, got 0"):
        dirichlet(records, tenants(3), "category", 0)
    few = [{"id": i, "category": "x"} for i in range(3)]
    with pytest.raises(DataError, match=r"left a tenant empty in all 5 draws \(3 records"):
        dirichlet(few, tenants(3), "category", 0.001, seed=0, max_draws=5)


@pytest.mark.parametrize(
    ("call", "error", "pattern"),
    [
        (lambda rs: iid(rs, [], seed=0), ConfigError, "no tenants"),
        (lambda rs: iid(rs, ["a", "b", "a"], seed=0), ConfigError, "tenant names repeat: a"),
        (lambda rs: iid(rs[:2], tenants(3), seed=0), DataError, "2 record.* cannot fill 3"),
        (
            lambda rs: pathological([*rs, {"id": 999}], tenants(2), "category", 1),
            DataError,
            r"record 200 has no field 'category' .* fields present: id",
        ),
        (
            lambda rs: by_field([{"category": ["a"]}, *rs], tenants(5), "category"),
            DataError,
            r"record 0: field 'category' holds a list",
        ),
    ],
    ids=["no-tenants", "duplicate-tenant", "too-few-records", "missing-field", "unhashable"],
)
def test_common_errors(records: list[Record], call: Any, error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        call(records)


def test_partition_dispatches_by_name(records: list[Record]) -> None:
    names = tenants(5)
    assert ids(partition("iid", records, names, seed=2)) == ids(iid(records, names, seed=2))
    assert ids(partition("by_field", records, names, field="category")) == ids(
        by_field(records, names, "category")
    )
    assert ids(partition("pathological", records, names, seed=2, field="category", k=2)) == ids(
        pathological(records, names, "category", 2, seed=2)
    )
    assert ids(partition("dirichlet", records, names, seed=2, field="category", alpha=1.0)) == ids(
        dirichlet(records, names, "category", 1.0, seed=2)
    )


@pytest.mark.parametrize(
    ("method", "options", "pattern"),
    [
        ("random", {}, "unknown partition method 'random'"),
        ("by_field", {}, "needs a field"),
        ("pathological", {"field": "category"}, "needs k"),
        ("dirichlet", {"field": "category"}, "needs alpha"),
    ],
)
def test_partition_option_errors(
    records: list[Record], method: str, options: dict[str, Any], pattern: str
) -> None:
    with pytest.raises(ConfigError, match=pattern):
        partition(method, records, tenants(3), **options)


def test_count_table_counts_and_renders() -> None:
    parts = {
        "a": [{"category": "x"}, {"category": "x"}, {"category": "y"}],
        "b": [{"category": "y"}, {}],
    }
    table = count_table(parts, "category")
    assert table.values == ("(none)", "x", "y")
    assert table.counts == ((0, 2, 1), (1, 0, 1))
    assert table.row_totals == (3, 2)
    assert table.column_totals == (1, 2, 2)
    assert table.to_markdown() == (
        "| tenant | (none) | x | y | total |\n|---|---|---|---|---|\n"
        "| a | 0 | 2 | 1 | 3 |\n| b | 1 | 0 | 1 | 2 |\n| total | 1 | 2 | 2 | 5 |\n"
    )
    console = Console(file=io.StringIO(), width=80, color_system=None)
    console.print(table.to_rich())
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "records per tenant and category" in text
    assert [line.split() for line in text.splitlines() if line.strip().startswith("│ a")] == [
        ["│", "a", "│", "0", "│", "2", "│", "1", "│", "3", "│"]
    ]


def test_write_partitions_stores_each_tenant_file(tmp_path: Path, records: list[Record]) -> None:
    parts = pathological(records, tenants(2), "category", 2, seed=0)
    uris = {t: (tmp_path / t / "train.jsonl").as_uri() for t in parts}
    written = write_partitions(parts, uris)
    for tenant, uri in uris.items():
        assert written[tenant] == (tmp_path / tenant / "train.jsonl").stat().st_size
        assert read_records(uri) == parts[tenant]
        assert (tmp_path / tenant / "train.jsonl.sha256").is_file()


def test_write_partitions_needs_one_uri_per_tenant(tmp_path: Path, records: list[Record]) -> None:
    parts = iid(records, ["a", "b"], seed=0)
    with pytest.raises(
        ConfigError, match=r"without a URI: \['b'\]; URIs for unknown tenants: \['c'\]"
    ):
        write_partitions(parts, {"a": str(tmp_path / "a.jsonl"), "c": str(tmp_path / "c.jsonl")})
