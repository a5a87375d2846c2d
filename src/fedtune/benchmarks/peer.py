"""The peer benchmark: a whole federated job, fedtune against a bare PyTorch + PEFT loop.

Both sides do the same federated work on the suite: ``rounds`` x ``tenants`` x ``steps`` of
LoRA training (FedAvg, batch ``batch_size``, ``max_seq_len`` tokens), measured as whole-process
wall time (imports, data, model, training, aggregation; fedtune also stores every message and
exports the final model). fedtune's rows also give the peak resident memory of the engine
process and of each worker (from the run summary; the largest over the repetitions). The bare
loop runs the tenants one after another on one thread;
fedtune runs with 1 worker (in-process) and with N worker processes. The compute-only floor
is the bare loop's training and averaging alone, on random tokens in the shapes of its batches
(measured beforehand): no data reading, no tokenization, no stores; every row's ``/ floor``
ratio is against it (the bare loop's own reading and tokenizing flatter ``/ bare``). Runs alternate so that a
busy machine slows both sides alike. Two jobs by default (:data:`~fedtune.benchmarks.system.
SMALL_PEER`, where fixed costs dominate, and :data:`~fedtune.benchmarks.system.LARGE_PEER`). ``python -m fedtune.benchmarks.peer JOB.json`` is the bare
loop itself, ``... --floor JOB.json SHAPES.json`` the floor.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from fedtune.benchmarks.jobs import bench_job
from fedtune.benchmarks.suite import load_manifest
from fedtune.benchmarks.workspace import Workspace

if TYPE_CHECKING:
    from fedtune.benchmarks.system import PeerJob, SystemSpec

Log = Callable[[str], None]
Batches = Callable[[int, int, str], Iterator[dict[str, Any]]]


def _timed(argv: Sequence[str], threads: int) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=3600)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} failed:\n{done.stderr[-2000:]}")
    return seconds


FLOOR = "compute-only floor"
"""The row of the bare loop on random token batches (:func:`compute_floor_loop`)."""


def run_name(workers: int) -> str:
    """The row name of fedtune with ``workers`` workers."""
    return f"fedtune, {workers} worker(s)"


def peer_vs_bare(workspace: Workspace, spec: SystemSpec, log: Log) -> dict[str, Any]:
    """Whole-process wall time of the bare loop and of fedtune, for every peer job."""
    return {
        "cores": len(os.sched_getaffinity(0)),
        "commit": _commit(),
        "jobs": [_peer_job(workspace, spec, job, log) for job in spec.peer.jobs],
    }


def _peer_job(workspace: Workspace, spec: SystemSpec, peer: PeerJob, log: Log) -> dict[str, Any]:
    settings = replace(spec, batch_size=peer.batch_size, max_seq_len=peer.max_seq_len)
    manifest = load_manifest(workspace.suite_dir)
    tenants = sorted(manifest["tenants"], key=lambda t: -manifest["tenants"][t]["records"])
    tenants = sorted(tenants[: peer.tenants])
    times: dict[str, list[float]] = {}
    memory: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="fedtune-peer-") as tmp:
        job = bench_job(
            settings,
            name="peer",
            algorithm="fedavg",
            model_dir=workspace.require_model(spec.model),
            suite_dir=workspace.suite_dir,
            tenants=tenants,
            workdir=Path(tmp) / "work",
            seed=0,
            rounds=peer.rounds,
            local_steps=peer.steps,
        )
        job_file = Path(tmp) / "peer.yaml"
        job_file.write_text(yaml.safe_dump(job.model_dump(mode="json")), encoding="utf-8")
        shapes_file = Path(tmp) / "shapes.json"  # measured here, outside every timed run
        shapes_file.write_text(json.dumps(batch_shapes(str(job_file))), encoding="utf-8")
        bare = [sys.executable, "-m", "fedtune.benchmarks.peer"]
        runs: list[tuple[str, list[str], int]] = [
            ("bare", [*bare, str(job_file)], 1),
            (FLOOR, [*bare, "--floor", str(job_file), str(shapes_file)], 1),
        ]
        summary_file = Path(tmp) / "summary.json"
        for workers in peer.workers:
            argv = [sys.executable, "-m", "fedtune.cli.main", "run", str(job_file), "--fresh",
                    "--no-progress", "--workers", str(workers), "--summary-json", str(summary_file)]
            runs.append((run_name(workers), argv, 1))
        for rep in range(spec.peer.reps):
            for name, argv, threads in runs:
                # Every fedtune run starts as a first run: the last one's stores are removed
                # here, untimed, rather than by `--fresh` inside the timed process.
                shutil.rmtree(job.workdir, ignore_errors=True)
                summary_file.unlink(missing_ok=True)
                seconds = _timed(argv, threads)
                times.setdefault(name, []).append(seconds)
                if summary_file.exists():
                    _keep_peaks(memory.setdefault(name, {}), json.loads(summary_file.read_text()))
                log(f"peer {peer.name} rep {rep + 1}: {name} {seconds:.1f} s")
    best = {name: min(values) for name, values in times.items()}
    aims = {run_name(w): aim for w, aim in peer.aims.items()}
    rows = []
    for name in times:
        ratio = best[name] / best["bare"]
        row = {"run": name, "seconds": best[name], "ratio": ratio,
               "floor_ratio": best[name] / best[FLOOR], "all": times[name], **memory.get(name, {})}
        if name in aims:
            floor_ratio = best[name] / best[FLOOR]
            row |= {"aim": aims[name], "aim_of": FLOOR, "met": floor_ratio <= aims[name]}
        rows.append(row)
    return {
        "name": peer.name,
        "job": {"rounds": peer.rounds, "tenants": len(tenants), "steps": peer.steps,
                "batch_size": peer.batch_size, "max_seq_len": peer.max_seq_len, "model": spec.model},
        "rows": rows,
    }


def _keep_peaks(peaks: dict[str, Any], summary: dict[str, Any]) -> None:
    """Fold one run's peak memory (MiB) into ``peaks``: the engine's, and each worker's."""
    engine = summary.get("engine_peak_rss_mib")
    if engine is not None:
        peaks["engine_peak_rss_mib"] = max(engine, peaks.get("engine_peak_rss_mib", 0.0))
    workers = [w.get("peak_rss_mib", 0.0) for w in summary.get("workers", [])]
    if workers:
        before = peaks.get("workers_peak_rss_mib", [0.0] * len(workers))
        peaks["workers_peak_rss_mib"] = [max(a, b) for a, b in zip(before, workers, strict=True)]


def _commit() -> str | None:
    """The checked-out commit the measurement ran on (None outside a git checkout)."""
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=False, timeout=10, cwd=Path(__file__).parent)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _peft_model(job: Any) -> tuple[Any, Any]:
    """The job's base model with LoRA, as a PyTorch + PEFT user would build it, and its
    tokenizer."""
    import torch
    from peft import LoraConfig, get_peft_model

    from fedtune.models.loading import load_pretrained
    from fedtune.models.lora import DEFAULT_TARGETS

    base, tokenizer = load_pretrained(job.model.uri)
    for param in base.parameters():
        param.requires_grad_(False)
    torch.manual_seed(job.seed)
    model = get_peft_model(
        base,
        LoraConfig(
            r=job.lora.r,
            lora_alpha=job.lora.alpha,
            lora_dropout=0.0,
            target_modules=list(job.lora.target_modules or DEFAULT_TARGETS["llama"]),
            task_type="CAUSAL_LM",
        ),
    )
    return model, tokenizer


def _fedavg(model: Any, job: Any, weights: dict[str, float], batches: Batches) -> None:
    """``rounds`` of FedAvg over the tenants in sequence, each training ``batches(round,
    seed, tenant)`` from the global adapter; the average weighted by ``weights``."""
    import torch
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    global_state = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
    for round_index in range(1, job.rounds + 1):
        states = []
        for seed, name in enumerate(sorted(weights)):
            set_peft_model_state_dict(model, global_state)
            params = [p for p in model.parameters() if p.requires_grad]
            optimizer = torch.optim.AdamW(params, lr=job.training.lr, weight_decay=0.0)
            model.train()
            for batch in batches(round_index, seed, name):
                loss = model(**batch).loss
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            states.append({k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()})
        total = sum(weights.values())
        shares = [weights[name] for name in sorted(weights)]
        global_state = {k: sum(w * s[k] for w, s in zip(shares, states, strict=True)) / total for k in states[0]}


def _encoded(job: Any, tokenizer: Any) -> dict[str, list[Any]]:
    from fedtune.data.loader import read_examples
    from fedtune.data.tokenize import encode_examples

    return {t.name: encode_examples(read_examples(t.data_uri), tokenizer, job.training.max_seq_len)
            for t in job.tenants}


def _indices(job: Any, examples: int, round_index: int, seed: int) -> Any:
    from fedtune.training.local import batch_indices

    steps = int(job.training.local_steps or 1)
    return batch_indices(examples, job.training.batch_size, steps, seed + round_index)


def bare_federated_loop(job_path: str) -> dict[str, Any]:
    """FedAvg of LoRA adapters written as a PyTorch + PEFT user would, tenants in sequence."""
    import torch

    from fedtune.config import load_job
    from fedtune.data.tokenize import collate

    torch.set_num_threads(1)
    job = load_job(job_path)
    model, tokenizer = _peft_model(job)
    data = _encoded(job, tokenizer)
    pad = int(tokenizer.pad_token_id)

    def batches(round_index: int, seed: int, name: str) -> Iterator[dict[str, Any]]:
        for indices in _indices(job, len(data[name]), round_index, seed):
            yield collate([data[name][i] for i in indices], pad)

    _fedavg(model, job, {n: float(len(e)) for n, e in data.items()}, batches)
    return {"rounds": job.rounds, "tenants": len(data)}


def batch_shapes(job_path: str) -> dict[str, Any]:
    """The (rows, length) of every batch the bare loop trains, by tenant and round, and each
    tenant's weight: what the compute-only floor replays with random tokens."""
    from fedtune.config import load_job
    from fedtune.models.tokenizer import load_tokenizer

    job = load_job(job_path)
    tokenizer = load_tokenizer(job.model.uri)  # type: ignore[union-attr]  # a pretrained model
    data = _encoded(job, tokenizer)
    return {
        "vocab_size": len(tokenizer),
        "tenants": {
            name: {
                "weight": float(len(encoded)),
                "rounds": [
                    [[len(idx), max(len(encoded[i]["input_ids"]) for i in idx)]
                     for idx in _indices(job, len(encoded), round_index, seed)]
                    for round_index in range(1, job.rounds + 1)
                ],
            }
            for seed, (name, encoded) in enumerate(sorted(data.items()))
        },
    }


def compute_floor_loop(job_path: str, shapes_path: str) -> dict[str, Any]:
    """The bare loop's training and averaging on random tokens of its batches' shapes: no
    data read, no tokenization, no stores; the least a whole process can take for the job."""
    import torch

    from fedtune.config import load_job

    torch.set_num_threads(1)
    job = load_job(job_path)
    shapes = json.loads(Path(shapes_path).read_text("utf-8"))
    model, _ = _peft_model(job)
    tenants = shapes["tenants"]
    generator = torch.Generator().manual_seed(job.seed)

    def batches(round_index: int, _seed: int, name: str) -> Iterator[dict[str, Any]]:
        for rows, length in tenants[name]["rounds"][round_index - 1]:
            ids = torch.randint(0, shapes["vocab_size"], (rows, length), generator=generator)
            yield {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}

    _fedavg(model, job, {n: t["weight"] for n, t in tenants.items()}, batches)
    return {"rounds": job.rounds, "tenants": len(tenants)}


if __name__ == "__main__":
    if sys.argv[1] == "--floor":
        print(json.dumps(compute_floor_loop(sys.argv[2], sys.argv[3])))
    else:
        print(json.dumps(bare_federated_loop(sys.argv[1])))
