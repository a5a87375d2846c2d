"""What a tenant's DP-SGD costs per client step: the engine's step with and without it.

``python -m fedtune.benchmarks.dp_sgd [--out docs/results/dp-sgd.json]`` runs the quickstart
job's round-1 client step of one tenant (the tiny Llama, its LoRA, its batches) as the engine
runs it (store in, train, store out), once plainly and once under ``tenants[].dp_sgd``,
alternating which goes first, on one torch thread. Per-pair ratios cancel the load that other
processes put on a shared machine; their median is the number to quote. The step's own
``train_seconds`` (inside the loop) is reported beside the whole step's wall time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from fedtune.benchmarks.secagg import commit
from fedtune.config.loading import load_job, parse_job
from fedtune.engines import layout, steps

EXAMPLE = Path("examples/quickstart.yaml")
TENANT = "tenant-a"
DP = {"noise_multiplier": 1.0, "max_grad_norm": 1.0}


def _job(root: Path, name: str, dp: dict[str, Any] | None) -> Any:
    raw = load_job(EXAMPLE).model_dump(mode="json", exclude_none=True)
    raw.update(name=name, workdir=str(root / name), tracking={"backend": "none"})
    raw["tenants"] = [dict(t, **({"dp_sgd": dp} if dp and t["name"] == TENANT else {})) for t in raw["tenants"]]
    return parse_job(raw)


def _timed_step(env: steps.TenantEnv) -> tuple[float, float]:
    key = layout.update_key(1)
    for suffix in (".safetensors", ".json"):
        env.exchange.delete(key + suffix)
    started = time.perf_counter()
    result = steps.client_step(env, 1)
    return time.perf_counter() - started, float(result["meta"]["train_seconds"])


def measure(reps: int = 5) -> dict[str, Any]:
    """Paired timings of the plain and the DP-SGD client step (``reps`` pairs after a warm-up)."""
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="fedtune-dpsgd-") as tmp:
        envs = {}
        for name, dp in (("plain", None), ("dp-sgd", DP)):
            job = _job(Path(tmp), name, dp)
            provider = steps.ProviderEnv.create(job)
            steps.init_step(provider)
            steps.configure_step(provider, 1)
            envs[name] = steps.TenantEnv.create(job, TENANT)
            _timed_step(envs[name])  # warm-up: builds and caches the model, as later rounds find it
        runs: dict[str, list[tuple[float, float]]] = {"plain": [], "dp-sgd": []}
        for rep in range(reps):
            order = ("plain", "dp-sgd") if rep % 2 == 0 else ("dp-sgd", "plain")
            for name in order:
                runs[name].append(_timed_step(envs[name]))
        training = envs["plain"].job.training
        examples = len(envs["plain"].ctx.encode(envs["plain"].data().train))
    ratios = [d[0] / p[0] for p, d in zip(runs["plain"], runs["dp-sgd"], strict=True)]
    train_ratios = [d[1] / p[1] for p, d in zip(runs["plain"], runs["dp-sgd"], strict=True)]
    return {
        "commit": commit(),
        "job": str(EXAMPLE),
        "tenant": TENANT,
        "examples": examples,
        "local_steps": training.local_steps,
        "batch_size": training.batch_size,
        "dp_sgd": DP,
        "reps": reps,
        "torch_threads": 1,
        "step_seconds": {k: [round(s, 4) for s, _ in v] for k, v in runs.items()},
        "train_seconds": {k: [round(t, 4) for _, t in v] for k, v in runs.items()},
        "best_step_seconds": {k: min(s for s, _ in v) for k, v in runs.items()},
        "ratio_median": statistics.median(ratios),
        "train_ratio_median": statistics.median(train_ratios),
    }


def main(argv: list[str] | None = None) -> int:
    """Measure and print (and with ``--out``, write) the results JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="timed pairs (default 5)")
    parser.add_argument("--out", help="write the results JSON here")
    args = parser.parse_args(argv)
    results = measure(args.reps)
    text = json.dumps(results, indent=2, sort_keys=True) + "\n"
    if args.out:
        Path(args.out).write_text(text, "utf-8")
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
