"""``--engine kfp-local`` against the local engine on the 2-tenant x 2-round job (issue 14).

Both engines run the same job as whole ``fedtune run`` processes (imports, tasks, export),
alternating, best of ``--reps``, one torch thread per process, each run in a fresh work
directory. The job is the one ``tests/kfp/test_kfp_local.py`` checks for bitwise equality:
SCAFFOLD, tenants a and b of the quickstart data, 2 rounds of 2 SGD steps, a 2-layer
hidden-32 Llama. ``--baseline-src`` adds kfp-local runs of another source tree (e.g. the
commit before the lazy imports), alternated with the others, so before and after are
measured side by side on the same load.

``python -m fedtune.benchmarks.kfp_local --reps 3 --out docs/results/kfp-local.json``, then
``python -m fedtune.benchmarks.docs --write`` regenerates the table in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import yaml

from fedtune.benchmarks.peer import _commit

AIM: Final = 3.0
"""Issue 14: kfp-local at most 3x the local engine's wall time on this job."""


def job_dict(workdir: Path, data: Path) -> dict[str, Any]:
    """The 2-tenant x 2-round SCAFFOLD job of the kfp-local equality test."""
    return {
        "name": "kfp",
        "seed": 7,
        "workdir": str(workdir),
        "model": {"source": "tiny", "arch": "llama", "hidden_size": 32, "num_layers": 2,
                  "num_heads": 2, "intermediate_size": 64, "max_position_embeddings": 128},
        "algorithm": {"name": "scaffold"},
        "rounds": 2,
        "min_clients": 1,
        "training": {"local_steps": 2, "batch_size": 4, "lr": 0.01, "optimizer": "sgd",
                     "max_seq_len": 160},
        "lora": {"r": 4, "alpha": 8},
        "tenants": [{"name": f"tenant-{x}", "data_uri": str(data / f"tenant-{x}.jsonl")}
                    for x in "ab"],
        "tracking": {"backend": "none"},
    }


def _timed_run(job_path: Path, engine: str, src: Path) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(src)}
    argv = [sys.executable, "-m", "fedtune.cli.main", "run", str(job_path), "--engine", engine,
            "--no-progress"]
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=3600)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{engine} run from {src} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return seconds


def measure(reps: int, data: Path, baseline_src: Path | None = None) -> dict[str, Any]:
    """Alternate the runs ``reps`` times; return every time, the best of each, the ratios."""
    src = Path(__file__).resolve().parents[2]
    runs: dict[str, tuple[str, Path]] = {"local": ("local", src), "kfp-local": ("kfp-local", src)}
    if baseline_src is not None:
        runs["kfp-local (baseline)"] = ("kfp-local", baseline_src.resolve())
    baseline_commit = _tree_commit(baseline_src) if baseline_src is not None else None
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="fedtune-kfp-bench-") as tmp:
        for rep in range(reps):
            for name, (engine, tree) in runs.items():
                work = Path(tmp) / "work"
                shutil.rmtree(work, ignore_errors=True)  # every run a first run, untimed
                job_path = Path(tmp) / "job.yaml"
                job_path.write_text(yaml.safe_dump(job_dict(work, data.resolve())), "utf-8")
                seconds[name].append(_timed_run(job_path, engine, tree))
                print(f"rep {rep + 1}/{reps} {name}: {seconds[name][-1]:.1f} s", flush=True)
    best = {name: min(values) for name, values in seconds.items()}
    return {
        "commit": _commit(),
        "baseline_commit": baseline_commit,
        "job": "SCAFFOLD, 2 tenants x 2 rounds x 2 steps, batch 4, 2-layer hidden-32 Llama",
        "reps": reps,
        "cores": len(os.sched_getaffinity(0)),
        "load_average": {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)},
        "seconds": seconds,
        "best": best,
        "ratio": {name: best[name] / best["local"] for name in runs},
        "aim": AIM,
    }


def _tree_commit(tree: Path) -> str | None:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=False, cwd=tree)
    return done.stdout.strip() or None if done.returncode == 0 else None


def main(argv: list[str] | None = None) -> int:
    """Measure and write the results JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="alternating repetitions (best of)")
    parser.add_argument("--data", default="examples/data/quickstart", help="quickstart data folder")
    parser.add_argument("--baseline-src", help="another fedtune source tree (its src/) to compare")
    parser.add_argument("--out", required=True, help="results JSON to write")
    args = parser.parse_args(argv)
    baseline = Path(args.baseline_src) if args.baseline_src else None
    results = measure(args.reps, Path(args.data), baseline)
    Path(args.out).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n", "utf-8")
    print(json.dumps(results["ratio"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
