"""Peak memory of a provider-side training step, plain PyTorch or under DeepSpeed ZeRO-3.

The provider's heavy phases (FedBiOT's emulator alignment, FedPT's and FedMKT's
distillation) train many parameters of a model on public data. This module measures such a
step on its own: full-parameter AdamW steps of a tiny Llama with random weights on random
tokens (memory depends on shapes, not values). Peak memory is a per-process high-water mark,
so each measurement runs in a fresh process: :func:`measure` starts
``python -m fedtune.benchmarks.server_memory`` once per mode (and once per rank), and the
child reports JSON. On CUDA the peak is ``torch.cuda.max_memory_allocated``; on CPU it is
the resident set's high-water mark (``VmHWM``, reset after the model is built and
DeepSpeed imported, so the peak counts the model plus what training adds).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

__all__ = ["ServerMemorySpec", "measure", "reset_peak", "status_kib"]

logger = logging.getLogger(__name__)

_MIB: Final = 2**20
MODES: Final = ("plain", "zero3")


@dataclass(frozen=True)
class ServerMemorySpec:
    """The model and step of the measurement."""

    hidden_size: int = 512
    num_layers: int = 8
    num_heads: int = 8
    intermediate_size: int = 1376
    batch_size: int = 4
    seq_len: int = 128
    steps: int = 3
    zero3_ranks: tuple[int, ...] = (1, 2)  # ZeRO-3 process counts to measure
    timeout_s: float = 600.0

    def describe(self) -> str:
        """One line for reports."""
        return (
            f"Llama hidden {self.hidden_size}, {self.num_layers} layers, full-parameter AdamW, "
            f"batch {self.batch_size} x {self.seq_len} tokens, {self.steps} steps"
        )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` memory field in KiB (``VmRSS``, ``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise OSError(f"{field} not in /proc/self/status")


def reset_peak() -> bool:
    """Reset the resident high-water mark (Linux clear_refs 5); False where unsupported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _child(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from fedtune.models.tiny import build_tiny_model

    torch.manual_seed(0)
    cuda = torch.cuda.is_available()
    model = build_tiny_model(
        "llama",
        vocab_size=1024,
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        intermediate_size=args.intermediate_size,
        max_position_embeddings=max(256, args.seq_len),
        seed=0,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    ids = torch.randint(
        3, 1024, (args.batch_size, args.seq_len), generator=torch.Generator().manual_seed(1)
    )
    # Counted before DeepSpeed partitions the parameters (ZeRO-3 leaves them empty).
    parameters = sum(p.numel() for p in model.parameters())
    if args.mode == "zero3":
        # Imported before the baseline: the library's own import is not the step's memory.
        import deepspeed  # noqa: F401
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    before_kib = status_kib("VmRSS")
    reset = reset_peak()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()
    durations = []
    if args.mode == "plain":
        device = torch.device("cuda" if cuda else "cpu")
        model.to(device)  # type: ignore[arg-type]  # transformers' stub of .to
        for _ in range(args.steps):
            started = time.perf_counter()
            loss = model(input_ids=ids.to(device), labels=ids.to(device)).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            durations.append(time.perf_counter() - started)
    else:
        from fedtune.training.deepspeed import DeepSpeedTrainer, build_config

        trainer = DeepSpeedTrainer(
            model,
            model.parameters(),
            optimizer,
            build_config(micro_batch_size=args.batch_size, zero_stage=3),
        )
        for _ in range(args.steps):
            started = time.perf_counter()
            batch = ids.to(trainer.device)
            loss = trainer(input_ids=batch, labels=batch).loss
            trainer.backward(loss)
            trainer.step()
            durations.append(time.perf_counter() - started)
    peak_kib = status_kib("VmHWM") if reset else None
    steady = durations[1:] or durations  # the first step allocates the optimizer state
    result: dict[str, Any] = {
        "mode": args.mode,
        "rank": int(os.environ.get("RANK", "0")),
        "ranks": int(os.environ.get("WORLD_SIZE", "1")),
        "parameters": parameters,
        "seconds_per_step": sum(steady) / len(steady),
        "rss_before_mib": before_kib / 1024,
    }
    if cuda:
        result["peak_mib"] = torch.cuda.max_memory_allocated() / _MIB
        result["added_mib"] = result["peak_mib"]
        result["measure"] = "torch.cuda.max_memory_allocated"
    elif peak_kib is not None:
        result["peak_mib"] = peak_kib / 1024
        result["added_mib"] = (peak_kib - before_kib) / 1024
        result["measure"] = "VmHWM (resident high-water mark)"
    return result


def _run(spec: ServerMemorySpec, mode: str, ranks: int, out_dir: Path) -> dict[str, Any]:
    """Start ``ranks`` child processes for one mode; return the report of the largest peak."""
    import torch

    port = str(_free_port())
    procs = []
    for rank in range(ranks):
        env = dict(os.environ)
        if mode == "zero3":
            env.update(
                RANK=str(rank),
                WORLD_SIZE=str(ranks),
                LOCAL_RANK=str(rank),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
            )
            if not torch.cuda.is_available():
                env.setdefault("DS_ACCELERATOR", "cpu")
        # The caller's thread budget, shared among the ranks instead of oversubscribed.
        env["OMP_NUM_THREADS"] = str(max(1, torch.get_num_threads() // ranks))
        out = out_dir / f"{mode}-{ranks}-{rank}.json"
        command = [
            sys.executable,
            "-m",
            "fedtune.benchmarks.server_memory",
            "--mode",
            mode,
            "--json",
            str(out),
            *(f"--{k.replace('_', '-')}={v}" for k, v in asdict(spec).items() if k in _CHILD_ARGS),
        ]
        procs.append(
            (
                out,
                subprocess.Popen(
                    command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
                ),
            )
        )
    reports = []
    errors = []
    for out, proc in procs:
        try:
            output, _ = proc.communicate(timeout=spec.timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
            errors.append(f"timed out after {spec.timeout_s:.0f} s")
            continue
        if proc.returncode != 0 or not out.is_file():
            tail = output.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            errors.append(f"exit {proc.returncode}: {tail[0][:200]}")
            continue
        reports.append(json.loads(out.read_text("utf-8")))
    if errors or not reports:
        return {"mode": mode, "ranks": ranks, "error": "; ".join(errors) or "no report"}
    worst = max(reports, key=lambda r: r.get("peak_mib", 0.0))
    return {**worst, "per_rank_peak_mib": [r.get("peak_mib") for r in reports]}


_CHILD_ARGS: Final = (
    "hidden_size",
    "num_layers",
    "num_heads",
    "intermediate_size",
    "batch_size",
    "seq_len",
    "steps",
)


def _zero3_row(spec: ServerMemorySpec, ranks: int, out: Path) -> dict[str, Any]:
    """ZeRO-3 on ``ranks`` processes; on CUDA each rank needs a GPU of its own (NCCL refuses
    two ranks on one device), so a count above the GPUs present is a row saying so."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus and ranks > gpus:
        return {"mode": "zero3", "ranks": ranks,
                "error": f"skipped: {ranks} ranks need {ranks} GPUs, {gpus} present"}
    return _run(spec, "zero3", ranks, out)


def measure(
    spec: ServerMemorySpec, out_dir: str | Path, *, deepspeed: bool = True
) -> dict[str, Any]:
    """Plain PyTorch, then ZeRO-3 with each of ``spec.zero3_ranks`` processes (if asked).

    Returns ``{"description", "rows"}``; a row that failed carries ``error`` instead of
    numbers (e.g. DeepSpeed missing), so one failure does not lose the other rows.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = [_run(spec, "plain", 1, out)]
    if deepspeed:
        rows += [_zero3_row(spec, ranks, out) for ranks in spec.zero3_ranks]
    return {"description": spec.describe(), "spec": asdict(spec), "rows": rows}


def main(argv: Sequence[str] | None = None) -> int:
    """Child entry point: one measurement, written as JSON."""
    parser = argparse.ArgumentParser(description="one server-step memory measurement")
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--json", required=True, type=Path)
    for name in _CHILD_ARGS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    result = _child(args)
    args.json.write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
