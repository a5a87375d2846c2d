"""``fedtune partition``: split one dataset into per-tenant JSONL files, seeded."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from fedtune.core.errors import ConfigError
from fedtune.data.loader import read_records
from fedtune.data.partition import count_table, partition, write_partitions

out = Console(highlight=False)


def _parse_outputs(pairs: list[str]) -> dict[str, str]:
    uris: dict[str, str] = {}
    for pair in pairs:
        tenant, sep, uri = pair.partition("=")
        if not sep or not tenant or not uri:
            raise ConfigError(
                f"--out {pair!r} is not TENANT=URI",
                fix="Write each output as --out tenant-a=s3://bucket/a.jsonl (or a local path).",
            )
        if tenant in uris:
            raise ConfigError(f"--out names tenant {tenant!r} twice", fix="Name each tenant once.")
        uris[tenant] = uri
    return uris


def _partition(args: argparse.Namespace) -> int:
    uris = _parse_outputs(args.out)
    records = read_records(args.input)
    parts = partition(
        args.strategy.replace("-", "_"),
        records,
        list(uris),
        seed=args.seed,
        field=args.field,
        k=args.k,
        alpha=args.alpha,
    )
    written = write_partitions(parts, uris)
    out.print(count_table(parts, args.field or "category").to_rich())
    for tenant, size in written.items():
        out.print(f"{tenant}: {len(parts[tenant])} records, {size:,} bytes -> {uris[tenant]}")
    return 0


def register_partition(sub: Any) -> None:
    """Add ``fedtune partition`` to the CLI."""
    p = sub.add_parser(
        "partition",
        help="split a JSONL dataset into per-tenant files (IID, by field, pathological, Dirichlet)",
        description="Split INPUT (a JSONL file: path, file:// or s3:// URI) into one JSONL per "
        "tenant and print a tenant x category count table. Every strategy is seeded.",
        epilog="strategies:\n"
        "  iid           shuffled equal shares\n"
        "  by-field      one tenant per distinct value of --field (the papers' 'meta' split)\n"
        "  pathological  --k values of --field per tenant, equal shard sizes\n"
        "  dirichlet     per value of --field, shares ~ Dirichlet(--alpha) over tenants",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("input", help="the dataset to split (JSONL)")
    p.add_argument(
        "--strategy",
        required=True,
        choices=["iid", "by-field", "pathological", "dirichlet"],
        help="how to split",
    )
    p.add_argument(
        "--out",
        action="append",
        required=True,
        metavar="TENANT=URI",
        help="where a tenant's file goes; repeat once per tenant",
    )
    p.add_argument("--field", help="label field for by-field/pathological/dirichlet (e.g. category)")
    p.add_argument("--k", type=int, help="values per tenant (pathological)")
    p.add_argument("--alpha", type=float, help="Dirichlet concentration (dirichlet)")
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    p.set_defaults(handler=_partition)
