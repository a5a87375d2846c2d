"""How one round's provider cost grows with the number of tenants.

``python -m fedtune.benchmarks.tenant_scale [--tenants 10,50,200] [--out docs/results/tenant-scale.json]``
runs round 1 of the quickstart job (FedAvg, the tiny Llama and its LoRA, one local step)
with every tenant sampled (``clients_per_round`` = tenants), on one torch thread. The
provider's two steps of the round, configure (the broadcast, into each tenant's prefix) and
aggregate (validate every update, write the next state), are timed ``reps`` times each (their
outputs removed in between; the tenants' updates stay), best kept. Bytes written are what
those steps add to the file stores, each file counted once however many names (hard links)
it has: the disk space a round costs the provider. The tenants' own uploads are not the
provider's and are left out.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedtune.benchmarks.secagg import commit
from fedtune.config.job import JobConfig
from fedtune.config.loading import load_job, parse_job
from fedtune.engines import layout, steps
from fedtune.engines.publish import stored_size

EXAMPLE = Path("examples/quickstart.yaml")
TENANTS = (10, 50, 200)
PER_TENANT_GOAL_S = 0.1


def job_with_tenants(root: Path, tenants: int) -> JobConfig:
    """The quickstart job with ``tenants`` tenants (its three data files in turn), all sampled
    in each round, one local step each, under ``root``."""
    raw = load_job(EXAMPLE).model_dump(mode="json", exclude_none=True)
    files = [t["data_uri"] for t in raw["tenants"]]
    raw.update(
        name=f"scale-{tenants}", workdir=str(root), rounds=1, clients_per_round=tenants,
        min_clients=1, tracking={"backend": "none"},
        tenants=[{"name": f"t{i:03d}", "data_uri": files[i % len(files)]} for i in range(tenants)],
    )
    raw["training"] = dict(raw["training"], local_steps=1, batch_size=2)
    return parse_job(raw)


def stored_files(folders: Iterable[Path]) -> dict[tuple[int, int], int]:
    """Every file under ``folders`` once, by (device, inode), with its size: hard links to one
    file count once, as the disk holds them."""
    files: dict[tuple[int, int], int] = {}
    for folder in folders:
        for here, _dirs, names in os.walk(folder):
            for name in names:
                stat = os.stat(os.path.join(here, name))
                files[(stat.st_dev, stat.st_ino)] = stat.st_size
    return files


def provider_folders(job: JobConfig) -> list[Path]:
    """The folders of the job's provider-private store and of its exchange (file stores)."""
    stores = layout.JobStores(job)
    return [Path(stores.provider().uri.removeprefix("file://")),
            Path(stores.exchange_root().uri.removeprefix("file://"))]


def _written(job: JobConfig, before: Mapping[tuple[int, int], int]) -> int:
    now = stored_files(provider_folders(job))
    return sum(size for node, size in now.items() if node not in before)


def _timed(job: JobConfig, run: Any) -> tuple[float, int]:
    """Wall seconds of ``run()`` and the bytes it added to the provider's stores."""
    before = stored_files(provider_folders(job))
    started = time.perf_counter()
    run()
    return time.perf_counter() - started, _written(job, before)


def _clear_provider_outputs(env: steps.ProviderEnv, sampled: list[str]) -> None:
    """Remove what configure and aggregate wrote, so they run again in full."""
    for key in (layout.broadcast_key(1), layout.state_key(1)):
        for suffix in (".safetensors", ".json"):
            env.store().delete(key + suffix)
    for name in sampled:
        for suffix in (".safetensors", ".json"):
            env.stores.exchange(name).delete(layout.round_broadcast_key(1) + suffix)


def one_round(root: Path, tenants: int, reps: int) -> dict[str, Any]:
    """Round 1 with ``tenants`` tenants: the provider's best seconds and bytes per step."""
    job = job_with_tenants(root, tenants)
    provider = steps.ProviderEnv.create(job)
    steps.init_step(provider)
    sampled = steps.sample_clients(job, 1)
    runs: dict[str, list[tuple[float, int]]] = {"configure": [], "aggregate": []}
    for rep in range(reps):
        if rep:
            _clear_provider_outputs(provider, sampled)
        runs["configure"].append(_timed(job, lambda: steps.configure_step(provider, 1)))
        if rep == 0:  # the tenants train once; their updates serve every repetition
            for name in sampled:
                steps.client_step(steps.TenantEnv.create(job, name), 1)
        runs["aggregate"].append(
            _timed(job, lambda: steps.aggregate_step(provider, 1, sampled))
        )
    best = {k: min(s for s, _ in v) for k, v in runs.items()}
    written = {k: v[0][1] for k, v in runs.items()}
    copy = stored_size(provider.stores.exchange(sampled[0]), layout.round_broadcast_key(1))
    return {
        "tenants": tenants,
        "seconds": {k: [round(s, 4) for s, _ in v] for k, v in runs.items()},
        "best_seconds": best,
        "provider_seconds": sum(best.values()),
        "bytes_written": written,
        "provider_bytes": sum(written.values()),
        "broadcast_bytes_per_tenant": copy,
    }


def per_tenant_seconds(rows: Sequence[Mapping[str, Any]]) -> float:
    """The least-squares slope of the provider's seconds per round against tenants."""
    xs = [float(r["tenants"]) for r in rows]
    ys = [float(r["provider_seconds"]) for r in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / spread if spread else 0.0


def measure(tenants: tuple[int, ...] = TENANTS, reps: int = 3, root: Path | None = None) -> dict[str, Any]:
    """One round per number of tenants (under ``root``, default a temporary folder)."""
    import tempfile

    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="fedtune-scale-") as tmp:
        base = root or Path(tmp)
        rows = [one_round(base / f"n{n}", n, reps) for n in tenants]
    return {
        "commit": commit(),
        "job": str(EXAMPLE),
        "reps": reps,
        "torch_threads": 1,
        "rows": rows,
        "per_tenant_seconds": per_tenant_seconds(rows) if len(rows) > 1 else None,
        "per_tenant_goal_seconds": PER_TENANT_GOAL_S,
    }


def tenant_scale_markdown(results: Mapping[str, Any]) -> str:
    """The provider's cost of one round against tenants (``fedtune.benchmarks.tenant_scale``)."""
    lines = [
        f"**Provider cost of one round against tenants** ({results['job']}, FedAvg, every tenant "
        f"sampled, one local step; best of {results['reps']}, {results['torch_threads']} torch "
        "thread; bytes: files the provider's steps add to its file stores, hard links once):",
        "",
        "| tenants | configure | aggregate | provider total | broadcast bytes written | "
        "state bytes written | broadcast per tenant (as read) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["rows"]:
        best, written = r["best_seconds"], r["bytes_written"]
        lines.append(
            f"| {r['tenants']} | {best['configure']:.3f} s | {best['aggregate']:.3f} s | "
            f"{r['provider_seconds']:.3f} s | {written['configure']:,} | {written['aggregate']:,} | "
            f"{r['broadcast_bytes_per_tenant']:,} |"
        )
    slope = results.get("per_tenant_seconds")
    if slope is not None:
        goal = results["per_tenant_goal_seconds"]
        lines += ["", f"Provider seconds grow by {slope * 1000:.1f} ms per tenant (least-squares "
                  f"slope; goal under {goal * 1000:.0f} ms: {'met' if slope < goal else 'not met'})."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure and print (and with ``--out``, record) the results JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", default=",".join(map(str, TENANTS)),
                        help="comma-separated numbers of tenants (default 10,50,200)")
    parser.add_argument("--reps", type=int, default=3, help="timed runs of each step (default 3)")
    parser.add_argument("--out", help="write the results JSON here and regenerate docs/")
    args = parser.parse_args(argv)
    results = measure(tuple(int(n) for n in args.tenants.split(",")), args.reps)
    if args.out:
        from fedtune.benchmarks.report import record

        record(results, Path(args.out))
    print(json.dumps(results, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
