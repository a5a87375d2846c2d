"""Seeded partitioners that split one dataset among tenants, as the papers' experiments do.

Every partitioner takes a list of records and the tenant names and returns
``{tenant: [record, ...]}`` with the tenants in the given order. Guarantees, for all of them:

- deterministic for the same records, tenants and seed (numpy ``Generator`` seeded once);
- every record goes to at most one tenant (``iid``, ``by_field`` and ``dirichlet`` assign
  every record exactly once; ``pathological`` with ``balance=True`` may leave some out so
  that all shards are equally large);
- no tenant is left empty: a split that would leave one empty raises ``DataError``;
- records keep their original relative order within a tenant.

Methods: ``iid`` (uniform shuffle), ``by_field`` (one tenant per distinct value, FedBiOT's
Dolly-by-category / Rosetta-by-language splits), ``pathological`` (McMahan et al. 2017's
shards: each tenant gets ``k`` classes, FedPT's "each device two categories, equal sizes"),
``dirichlet`` (per class, tenant proportions ~ Dir(alpha), Hsu et al. 2019; FedPT uses 0.5,
FewFedPIT 1.0).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import numpy as np
from rich.table import Table

from fedtune.core.errors import ConfigError, DataError
from fedtune.data.jsonl import write_jsonl

__all__ = [
    "PARTITIONERS",
    "CountTable",
    "by_field",
    "check_alpha",
    "count_table",
    "dirichlet",
    "iid",
    "partition",
    "pathological",
    "write_partitions",
]

logger = logging.getLogger(__name__)

R = TypeVar("R", bound=Mapping[str, Any])
Parts = dict[str, list[R]]

PARTITIONERS: Final[tuple[str, ...]] = ("iid", "by_field", "pathological", "dirichlet")


def _check_tenants(tenants: Sequence[str], n_records: int) -> None:
    if not tenants:
        raise ConfigError("no tenants to partition among", fix="Name at least one tenant.")
    duplicates = sorted(t for t, n in Counter(tenants).items() if n > 1)
    if duplicates:
        raise ConfigError(
            f"tenant names repeat: {', '.join(duplicates)}", fix="Give every tenant a unique name."
        )
    if n_records < len(tenants):
        raise DataError(
            f"{n_records} record(s) cannot fill {len(tenants)} tenants without leaving one empty",
            fix="Use more records or fewer tenants.",
        )


def check_alpha(alpha: float) -> None:
    """Raise DataError unless ``alpha`` is a valid Dirichlet concentration (> 0)."""
    if not alpha > 0:
        raise DataError(
            f"dirichlet alpha must be > 0, got {alpha}",
            fix="Use e.g. 0.5 for strongly non-IID or 100 for nearly IID tenants.",
        )


def _labels(records: Sequence[Mapping[str, Any]], field: str) -> list[Hashable]:
    """The value of ``field`` of every record; DataError naming the first bad record."""
    labels: list[Hashable] = []
    for index, record in enumerate(records):
        if field not in record:
            raise DataError(
                f"record {index} has no field {field!r} to partition by; fields present: "
                f"{', '.join(sorted(record)) or '(none)'}",
                fix=f"Add {field!r} to every record or partition by another field.",
            )
        value = record[field]
        if not isinstance(value, Hashable):
            raise DataError(
                f"record {index}: field {field!r} holds a {type(value).__name__}, which cannot "
                f"be a partition class: {str(value)[:60]!r}",
                fix="Partition by a field holding strings or numbers.",
            )
        labels.append(value)
    return labels


def _sort_key(value: Hashable) -> tuple[str, str]:
    # Classes of mixed types (e.g. None next to strings) still sort deterministically.
    return (type(value).__name__, str(value))


def _classes(labels: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    """Record indices per class, classes in a stable sorted order."""
    groups: dict[Hashable, list[int]] = {}
    for index, label in enumerate(labels):
        groups.setdefault(label, []).append(index)
    return {label: groups[label] for label in sorted(groups, key=_sort_key)}


def _assemble(
    records: Sequence[R], tenants: Sequence[str], indices: Sequence[list[int]]
) -> Parts[R]:
    parts: Parts[R] = {}
    for tenant, chosen in zip(tenants, indices, strict=True):
        if not chosen:
            raise DataError(
                f"tenant {tenant!r} would receive no records",
                fix="Use more records, fewer tenants, or a less skewed split.",
            )
        parts[tenant] = [records[i] for i in sorted(chosen)]
    return parts


def iid(records: Sequence[R], tenants: Sequence[str], *, seed: int = 0) -> Parts[R]:
    """Shuffle and deal records into near-equal shares (sizes differ by at most one)."""
    _check_tenants(tenants, len(records))
    order = np.random.default_rng(seed).permutation(len(records))
    shares = np.array_split(order, len(tenants))
    return _assemble(records, tenants, [share.tolist() for share in shares])


def by_field(records: Sequence[R], tenants: Sequence[str], field: str) -> Parts[R]:
    """One tenant per distinct value of ``field``: sorted values map to tenants in order.

    Raises:
        DataError: If the number of distinct values differs from the number of tenants.
    """
    _check_tenants(tenants, len(records))
    groups = _classes(_labels(records, field))
    if len(groups) != len(tenants):
        values = ", ".join(str(v) for v in groups)
        raise DataError(
            f"field {field!r} has {len(groups)} distinct value(s) ({values}) but there are "
            f"{len(tenants)} tenants",
            fix=f"Use exactly {len(groups)} tenants, or another partitioner (pathological, "
            "dirichlet) for a different number.",
        )
    return _assemble(records, tenants, list(groups.values()))


def pathological(
    records: Sequence[R],
    tenants: Sequence[str],
    field: str,
    k: int,
    *,
    seed: int = 0,
    balance: bool = True,
) -> Parts[R]:
    """Each tenant gets shards of exactly ``k`` distinct classes.

    Classes are shuffled and laid out cyclically over the ``len(tenants) * k`` shard slots,
    so tenant ``t`` holds ``k`` consecutive, distinct classes and every class gets an equal
    number of slots (give or take one). Each class's records are shuffled and dealt into its
    shards. With ``balance=True`` all shards have the same size, the smallest any class can
    supply, and the records beyond it are left out (logged); with ``balance=False`` every
    record is used and shard sizes follow the class sizes.

    Raises:
        DataError: If ``k`` is not between 1 and the number of classes, or a class has fewer
            records than shards.
    """
    _check_tenants(tenants, len(records))
    groups = _classes(_labels(records, field))
    if not 1 <= k <= len(groups):
        raise DataError(
            f"pathological split needs 1 <= k <= number of classes; got k={k} with "
            f"{len(groups)} distinct value(s) of {field!r}",
            fix=f"Choose k between 1 and {len(groups)}.",
        )
    rng = np.random.default_rng(seed)
    classes = list(groups)
    order = rng.permutation(len(classes)).tolist()
    slots = [classes[order[i % len(classes)]] for i in range(len(tenants) * k)]
    unused = [str(c) for c in classes if c not in slots]
    if unused:
        logger.warning("pathological split: class(es) %s get no shard", ", ".join(unused))
    shards_of = {c: slots.count(c) for c in classes if c in slots}
    short = {str(c): len(groups[c]) for c, n in shards_of.items() if len(groups[c]) < n}
    if short:
        raise DataError(
            f"class(es) of {field!r} have fewer records than shards: {short}",
            fix="Use fewer tenants or a smaller k, or add records of those classes.",
        )
    shard_size = min(len(groups[c]) // n for c, n in shards_of.items())
    shards: dict[Hashable, list[list[int]]] = {}
    for c, n in shards_of.items():
        shuffled = rng.permutation(groups[c]).tolist()
        if balance:
            shards[c] = [shuffled[j * shard_size : (j + 1) * shard_size] for j in range(n)]
        else:
            shards[c] = [part.tolist() for part in np.array_split(np.array(shuffled), n)]
    indices: list[list[int]] = [[] for _ in tenants]
    for slot, c in enumerate(slots):
        indices[slot // k].extend(shards[c].pop(0))
    left_out = len(records) - sum(len(i) for i in indices)
    if left_out:
        logger.info("pathological split left %d record(s) out for equal shards", left_out)
    return _assemble(records, tenants, indices)


def dirichlet(
    records: Sequence[R],
    tenants: Sequence[str],
    field: str,
    alpha: float,
    *,
    seed: int = 0,
    max_draws: int = 100,
) -> Parts[R]:
    """Per class, split its records among tenants in proportions drawn from Dir(alpha).

    Small ``alpha`` (0.1) makes each tenant dominated by a few classes; large ``alpha``
    (100+) approaches an IID split. If a draw leaves a tenant empty the whole split is drawn
    again from the same generator (still deterministic), up to ``max_draws`` times.

    Raises:
        DataError: If ``alpha`` is not positive, or every draw leaves some tenant empty.
    """
    check_alpha(alpha)
    _check_tenants(tenants, len(records))
    groups = _classes(_labels(records, field))
    rng = np.random.default_rng(seed)
    for _ in range(max_draws):
        indices: list[list[int]] = [[] for _ in tenants]
        for members in groups.values():
            shuffled = rng.permutation(members)
            share = rng.dirichlet(np.full(len(tenants), float(alpha)))
            cuts = (np.cumsum(share)[:-1] * len(shuffled)).astype(int)
            for tenant_index, part in enumerate(np.split(shuffled, cuts)):
                indices[tenant_index].extend(part.tolist())
        if all(indices):
            return _assemble(records, tenants, indices)
    raise DataError(
        f"dirichlet(alpha={alpha}) left a tenant empty in all {max_draws} draws "
        f"({len(records)} records, {len(groups)} classes, {len(tenants)} tenants)",
        fix="Raise alpha, use fewer tenants, or use more records.",
    )


def partition(
    method: str,
    records: Sequence[R],
    tenants: Sequence[str],
    *,
    seed: int = 0,
    field: str | None = None,
    k: int | None = None,
    alpha: float | None = None,
) -> Parts[R]:
    """Dispatch to a partitioner by name, checking it got the options it needs.

    Raises:
        ConfigError: On an unknown method or a missing option.
    """
    if method == "iid":
        return iid(records, tenants, seed=seed)
    if method not in PARTITIONERS:
        raise ConfigError(
            f"unknown partition method {method!r}", fix=f"Use one of: {', '.join(PARTITIONERS)}."
        )
    if field is None:
        raise ConfigError(
            f"partition method {method!r} needs a field", fix="Set field, e.g. 'category'."
        )
    if method == "by_field":
        return by_field(records, tenants, field)
    if method == "pathological":
        if k is None:
            raise ConfigError("pathological partition needs k", fix="Set k, e.g. 2.")
        return pathological(records, tenants, field, k, seed=seed)
    if alpha is None:
        raise ConfigError("dirichlet partition needs alpha", fix="Set alpha, e.g. 0.5.")
    return dirichlet(records, tenants, field, alpha, seed=seed)


def _put_object(uri: str, data: bytes) -> int:
    """Write one blob at a full object URI through fedtune.storage; return bytes written."""
    # Imported here so the partitioners work (and are tested) without any store backend.
    from fedtune.storage import open_store, split_object_uri

    root, key = split_object_uri(uri)
    return int(open_store(root).put_bytes(key, data))


def write_partitions(
    parts: Mapping[str, Sequence[Mapping[str, Any]]], uris: Mapping[str, str]
) -> dict[str, int]:
    """Write each tenant's records as JSON Lines to its object URI.

    Args:
        parts: ``{tenant: records}`` as returned by a partitioner.
        uris: ``{tenant: object URI}``, e.g. ``{"tenant-a": "s3://bucket-a/data/train.jsonl"}``.

    Returns:
        Bytes written per tenant.

    Raises:
        ConfigError: If the tenants of ``parts`` and ``uris`` differ.
    """
    if set(parts) != set(uris):
        raise ConfigError(
            f"tenants without a URI: {sorted(set(parts) - set(uris)) or 'none'}; URIs for "
            f"unknown tenants: {sorted(set(uris) - set(parts)) or 'none'}",
            fix="Give exactly one URI per partitioned tenant.",
        )
    return {tenant: _put_object(uris[tenant], write_jsonl(parts[tenant])) for tenant in parts}


@dataclass(frozen=True)
class CountTable:
    """Records per tenant (rows) and per value of a field (columns), with totals."""

    field: str
    tenants: tuple[str, ...]
    values: tuple[str, ...]
    counts: tuple[tuple[int, ...], ...]

    @property
    def row_totals(self) -> tuple[int, ...]:
        """Records per tenant."""
        return tuple(sum(row) for row in self.counts)

    @property
    def column_totals(self) -> tuple[int, ...]:
        """Records per value, over all tenants."""
        return tuple(sum(row[i] for row in self.counts) for i in range(len(self.values)))

    def to_rich(self) -> Table:
        """A rich table for terminals (``rich.console.Console().print(table)``)."""
        table = Table(title=f"records per tenant and {self.field}")
        table.add_column("tenant", style="bold")
        for value in self.values:
            table.add_column(value, justify="right")
        table.add_column("total", justify="right", style="bold")
        for tenant, row, total in zip(self.tenants, self.counts, self.row_totals, strict=True):
            table.add_row(tenant, *map(str, row), str(total))
        table.add_row(
            "total",
            *map(str, self.column_totals),
            str(sum(self.row_totals)),
            style="bold",
            end_section=True,
        )
        return table

    def to_markdown(self) -> str:
        """The same table as GitHub-flavoured Markdown."""
        header = ["tenant", *self.values, "total"]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        rows = [*zip(self.tenants, self.counts, self.row_totals, strict=True)]
        rows.append(("total", self.column_totals, sum(self.row_totals)))
        for name, row, total in rows:
            lines.append("| " + " | ".join([name, *map(str, row), str(total)]) + " |")
        return "\n".join(lines) + "\n"


def count_table(parts: Mapping[str, Sequence[Mapping[str, Any]]], field: str) -> CountTable:
    """Count each tenant's records per value of ``field`` (missing or null shows as "(none)")."""
    per_tenant = {
        tenant: [str(r.get(field)) if r.get(field) is not None else "(none)" for r in records]
        for tenant, records in parts.items()
    }
    values = sorted({v for labels in per_tenant.values() for v in labels})
    counts = tuple(tuple(labels.count(value) for value in values) for labels in per_tenant.values())
    return CountTable(field=field, tenants=tuple(parts), values=tuple(values), counts=counts)
