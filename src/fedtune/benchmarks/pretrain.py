"""Pretrain tiny base models from scratch on the suite's pretraining corpus (the public set
and more of its category mixture), so federated runs start from models that know something.

The provider's "large" and "small" models (FedBiOT/Offsite-tuning compress the large one;
FedPT and FedMKT pair it with the small one) share the shipped byte-level BPE tokenizer, so
their vocabularies match. Training is plain full-parameter AdamW with linear warm-up and a
cosine decay, the loss on response tokens only (as in fine-tuning), with seeded weights and
batch order: the same spec gives the same weights on the same machine and thread count.
FedMKT's heterogeneous tenants' small models use other tokenizers
(:mod:`fedtune.benchmarks.vocabularies`) and architectures.
It trains on CUDA where a GPU is present, else on the CPU.
The result is a Hugging Face directory usable as ``model: {source: pretrained, uri: DIR}``,
with ``fedtune_pretrain.json`` beside it saying how it was made and what it scores.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import torch

from fedtune.benchmarks.scoring import EvalSet, evaluate_model
from fedtune.benchmarks.self_instruct import encode_raw, is_raw
from fedtune.benchmarks.vocabularies import check_tokenizer_spec, pretrain_tokenizer
from fedtune.core.errors import ConfigError
from fedtune.data.formats import to_example
from fedtune.data.tokenize import IGNORE_INDEX, Encoded, collate, encode_examples
from fedtune.models.loading import save_pretrained_dir
from fedtune.models.tiny import build_tiny_model
from fedtune.training.local import batch_indices

__all__ = [
    "PROGRESS_FILE",
    "REPORT_FILE",
    "ModelShape",
    "PretrainSpec",
    "cached_report",
    "corpus_digest",
    "plot_curve",
    "pretrain",
    "spec_hash",
]

logger = logging.getLogger(__name__)

REPORT_FILE: Final = "fedtune_pretrain.json"
# Written beside the model while it trains (the curve so far), replaced by REPORT_FILE at the end.
PROGRESS_FILE: Final = "fedtune_pretrain.progress.json"
CURVE_PLOT: Final = "pretrain_curve.png"
# How often (steps) the progress file is rewritten.
_PROGRESS_EVERY: Final = 50
CHECKPOINT_DIR: Final = "pretrain-checkpoint"


class Checkpoint:
    """A resumable pretraining state in one folder: ``state.safetensors`` (weights, AdamW
    moments, torch's RNG state) and ``state.json`` (step, spec hash, losses so far). Only a
    state of the same spec hash is resumed."""

    def __init__(self, folder: Path, key: str) -> None:
        self.folder = folder
        self.key = key

    def save(
        self, model: Any, optimizer: torch.optim.Optimizer, step: int, losses: list[float], tokens: int, seconds: float
    ) -> None:
        from safetensors.torch import save_file

        names = {id(p): n for n, p in model.named_parameters()}
        tensors = {f"model/{n}": p.detach().cpu().contiguous() for n, p in model.named_parameters()}
        steps = {}
        for param, state in optimizer.state.items():
            name = names[id(param)]
            tensors[f"exp_avg/{name}"] = state["exp_avg"].cpu().contiguous()
            tensors[f"exp_avg_sq/{name}"] = state["exp_avg_sq"].cpu().contiguous()
            steps[name] = float(state["step"])
        tensors["rng"] = torch.get_rng_state()
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / "state.safetensors.tmp"
        save_file(tensors, str(tmp))
        meta = {"key": self.key, "step": step, "losses": losses, "tokens": tokens, "seconds": seconds, "adam_steps": steps}
        (self.folder / "state.json.tmp").write_text(json.dumps(meta), "utf-8")
        # The JSON names the step; it is replaced last, so a crash leaves the previous pair.
        tmp.replace(self.folder / "state.safetensors")
        (self.folder / "state.json.tmp").replace(self.folder / "state.json")

    def load(
        self, model: Any, optimizer: torch.optim.Optimizer
    ) -> tuple[int, list[float], int, float] | None:
        """Restore the saved state into ``model`` and ``optimizer``; None if there is none
        for this spec (or it is incomplete)."""
        from safetensors.torch import load_file

        meta_path = self.folder / "state.json"
        if not meta_path.is_file():
            return None
        meta = json.loads(meta_path.read_text("utf-8"))
        if meta.get("key") != self.key:
            return None
        tensors = load_file(str(self.folder / "state.safetensors"))
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(tensors[f"model/{name}"])
                optimizer.state[param] = {
                    "step": torch.tensor(meta["adam_steps"][name]),
                    "exp_avg": tensors[f"exp_avg/{name}"].to(param.device),
                    "exp_avg_sq": tensors[f"exp_avg_sq/{name}"].to(param.device),
                }
        torch.set_rng_state(tensors["rng"])
        return int(meta["step"]), list(meta["losses"]), int(meta["tokens"]), float(meta["seconds"])

    def remove(self) -> None:
        """Delete the checkpoint (after a finished run)."""
        for name in ("state.safetensors", "state.json"):
            (self.folder / name).unlink(missing_ok=True)
        if self.folder.is_dir() and not any(self.folder.iterdir()):
            self.folder.rmdir()
# Loss points kept in the report (the curve is averaged into this many windows).
_CURVE_POINTS: Final = 20


@dataclass(frozen=True)
class ModelShape:
    """The architecture of a tiny model (see :func:`fedtune.models.tiny.build_tiny_model`)."""

    arch: str = "llama"
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 256
    max_position_embeddings: int = 256


@dataclass(frozen=True)
class PretrainSpec:
    """How one base model is pretrained."""

    shape: ModelShape = field(default_factory=ModelShape)
    steps: int = 600
    batch_size: int = 32
    lr: float = 2e-3
    warmup_steps: int = 30
    min_lr_ratio: float = 0.1  # the cosine decays to lr * min_lr_ratio
    max_seq_len: int = 160
    seed: int = 0
    tokenizer: str = "builtin"  # see fedtune.benchmarks.vocabularies
    # Forward passes per step (see _step_loss): the batch's records sorted by length and split, so
    # each pass pads only to its own longest record. The same loss and gradient as one pass.
    micro_batches: int = 1

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form."""
        return asdict(self)


def _check(spec: PretrainSpec) -> None:
    problems = [
        f"{name}={value} must be >= 1"
        for name, value in (
            ("steps", spec.steps),
            ("batch_size", spec.batch_size),
            ("micro_batches", spec.micro_batches),
        )
        if value < 1
    ]
    if spec.micro_batches > spec.batch_size:
        problems.append(f"micro_batches={spec.micro_batches} must be <= batch_size={spec.batch_size}")
    if not spec.lr > 0:
        problems.append(f"lr={spec.lr} must be > 0")
    if not 0 <= spec.warmup_steps < max(spec.steps, 1):
        problems.append(f"warmup_steps={spec.warmup_steps} must be in [0, steps)")
    tokenizer_problem = check_tokenizer_spec(spec.tokenizer)
    if tokenizer_problem:
        problems.append(tokenizer_problem)
    if problems:
        raise ConfigError(
            "invalid pretraining settings: " + "; ".join(problems),
            fix="Correct the pretraining options (fedtune bench pretrain --help).",
        )


def corpus_digest(records: Sequence[Mapping[str, Any]]) -> str:
    """sha256 of the training records (canonical JSON, in order)."""
    digest = hashlib.sha256()
    for record in records:
        digest.update(json.dumps(record, sort_keys=True).encode("utf-8") + b"\n")
    return digest.hexdigest()


def spec_hash(spec: PretrainSpec, corpus: str) -> str:
    """What identifies a pretrained model: its spec and its corpus's digest (16 hex digits).
    The same hash on the same machine, library versions and thread count gives the same
    weights, so a model directory whose report carries it need not be trained again."""
    described = spec.to_json()
    # Fields at the value they had before they existed are left out: earlier hashes hold.
    for name, before in (("tokenizer", "builtin"), ("micro_batches", 1)):
        if described[name] == before:
            del described[name]
    text = json.dumps({"spec": described, "corpus": corpus}, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def cached_report(out_dir: str | Path, spec: PretrainSpec, corpus: str) -> dict[str, Any] | None:
    """The report of the model in ``out_dir`` if it was pretrained with this spec and corpus
    (same :func:`spec_hash`), else None."""
    path = Path(out_dir) / REPORT_FILE
    if not path.is_file():
        return None
    try:
        report: dict[str, Any] = json.loads(path.read_text("utf-8"))
    except ValueError:
        return None
    return report if report.get("spec_hash") == spec_hash(spec, corpus) else None


def plot_curve(report: Mapping[str, Any], path: str | Path) -> Path:
    """The pretraining loss curve (window means) as a PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 3.6), dpi=110)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    curve = report["loss_curve"]
    axes.plot([p["step"] for p in curve], [p["loss"] for p in curve], marker="o", markersize=3)
    shape = report["spec"]["shape"]
    axes.set_title(
        f"pretraining: {shape['num_layers']} layers, hidden {shape['hidden_size']}, "
        f"{report['spec']['steps']} steps"
    )
    axes.set_xlabel("step")
    axes.set_ylabel("training loss (response tokens)")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    out = Path(path)
    figure.savefig(out, format="png")
    return out


def _write_progress(out_dir: Path, spec: PretrainSpec, losses: Sequence[float], seconds: float) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    progress = {
        "spec": spec.to_json(),
        "step": len(losses),
        "steps": spec.steps,
        "seconds": seconds,
        "loss_curve": _curve(losses),
    }
    tmp = out_dir / (PROGRESS_FILE + ".tmp")
    tmp.write_text(json.dumps(progress, indent=2) + "\n", encoding="utf-8")
    tmp.replace(out_dir / PROGRESS_FILE)


def _schedule(spec: PretrainSpec) -> Callable[[int], float]:
    """Learning-rate multiplier per step: linear warm-up, then cosine to min_lr_ratio."""

    def factor(step: int) -> float:
        if step < spec.warmup_steps:
            return (step + 1) / spec.warmup_steps
        progress = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
        return spec.min_lr_ratio + (1.0 - spec.min_lr_ratio) * cosine

    return factor


def _curve(losses: Sequence[float]) -> list[dict[str, float]]:
    window = max(1, math.ceil(len(losses) / _CURVE_POINTS))
    return [
        {"step": float(min(start + window, len(losses))), "loss": sum(chunk) / len(chunk)}
        for start in range(0, len(losses), window)
        for chunk in [losses[start : start + window]]
    ]


def _step_loss(model: Any, rows: Sequence[Encoded], pad_id: int, parts: int,
               device: torch.device) -> tuple[torch.Tensor, int]:
    """Forward and backward of one optimizer step over ``rows``; returns (loss, tokens).

    With ``parts`` > 1 the rows are sorted by length and split into that many passes, each
    padded to its own longest row, and each pass's summed token loss is divided by the whole
    batch's count of predicted tokens (``num_items_in_batch``): gradients accumulate to those
    of one pass over the batch, the loss to its mean, at a fraction of the padding.
    """
    if parts == 1:
        batch = {k: v.to(device) for k, v in collate(list(rows), pad_id).items()}
        loss = model(**batch).loss
        loss.backward()
        return loss.detach(), int(batch["attention_mask"].sum())
    ordered = sorted(rows, key=lambda row: len(row["input_ids"]))
    # Each row predicts its labelled tokens after the first (the causal shift).
    predicted = sum(sum(1 for label in row["labels"][1:] if label != IGNORE_INDEX) for row in rows)
    items = torch.tensor(predicted, device=device)
    total = torch.zeros((), device=device)
    tokens = 0
    size = math.ceil(len(ordered) / parts)
    for start in range(0, len(ordered), size):
        batch = {k: v.to(device) for k, v in collate(ordered[start : start + size], pad_id).items()}
        loss = model(**batch, num_items_in_batch=items).loss
        loss.backward()
        total += loss.detach()
        tokens += int(batch["attention_mask"].sum())
    return total, tokens


def _encode_corpus(records: Sequence[Mapping[str, Any]], tokenizer: Any, max_len: int) -> list[Any]:
    """The corpus's records in order: Dolly records in the training template, self-instruct
    demonstrations raw (:func:`fedtune.benchmarks.self_instruct.encode_raw`); those longer
    than ``max_len`` are skipped and counted in the log."""
    encoded = encode_examples(
        [to_example(dict(r)) for r in records if not is_raw(r)], tokenizer, max_len
    )
    raw = [encode_raw(r, tokenizer, max_len) for r in records if is_raw(r)]
    if None in raw:
        logger.warning("skipped %d of %d self-instruct demonstrations longer than max_seq_len=%d",
                       raw.count(None), len(raw), max_len)
    return encoded + [e for e in raw if e is not None]


def machine(device: torch.device) -> dict[str, Any]:
    """What made a base: library versions, platform, CPUs and the GPU's name (pretraining is
    deterministic only on one machine, library set and thread count)."""
    import os
    import platform

    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
    }


def pretrain(
    spec: PretrainSpec,
    train_records: Sequence[Mapping[str, Any]],
    test_records: Sequence[Mapping[str, Any]],
    out_dir: str | Path,
    *,
    progress: Callable[[int, float], Any] | None = None,
    checkpoint_every: int = 100,
) -> dict[str, Any]:
    """Train a tiny model from scratch and save it as a Hugging Face directory.

    Args:
        spec: Model shape and optimisation settings.
        train_records: Dolly-format records to train on (the suite's pretraining corpus).
        test_records: Held-out records; their exact match is recorded in the report.
        out_dir: Where the model directory goes (created; existing files are replaced).
        progress: Called with (step, loss) after every step.
        checkpoint_every: Steps between resumable checkpoints (``pretrain-checkpoint/``:
            weights, AdamW moments, RNG state, the curve so far; safetensors + JSON). An
            interrupted run called again with the same spec and corpus resumes from the
            last one and ends with the same weights as an uninterrupted run.

    Returns:
        The report also written to ``out_dir/fedtune_pretrain.json`` (with ``spec_hash``, see
        :func:`cached_report`); the loss curve is also plotted to ``pretrain_curve.png``, and
        while training, ``fedtune_pretrain.progress.json`` holds the curve so far.

    Raises:
        ConfigError: On invalid settings.
        ModelError: If the shape does not fit together.
        DataError: If no record fits ``max_seq_len``.
    """
    _check(spec)
    tokenizer = pretrain_tokenizer(spec.tokenizer, train_records)
    shape = spec.shape
    model = build_tiny_model(
        shape.arch,  # type: ignore[arg-type]  # checked by build_tiny_model
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        num_layers=shape.num_layers,
        num_heads=shape.num_heads,
        intermediate_size=shape.intermediate_size,
        max_position_embeddings=shape.max_position_embeddings,
        seed=spec.seed,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    # A GPU where one is present (bigger models); the weights are saved from the CPU.
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)  # type: ignore[arg-type]  # transformers' stub of .to
    # TF32 matmuls on a GPU (fp32 accumulation; as deterministic, several times faster);
    # the process's setting is restored after training.
    precision = torch.get_float32_matmul_precision()
    matmul_precision = "high" if device.type == "cuda" else precision
    torch.set_float32_matmul_precision(matmul_precision)
    corpus = corpus_digest(train_records)
    progress_dir = Path(out_dir)
    encoded = _encode_corpus(train_records, tokenizer, spec.max_seq_len)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(spec))
    checkpoint = Checkpoint(progress_dir / CHECKPOINT_DIR, spec_hash(spec, corpus))
    losses: list[float] = []
    tokens = 0
    done = 0
    spent = 0.0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        resumed = checkpoint.load(model, optimizer)
        if resumed is not None:
            done, losses, tokens, spent = resumed
            with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()"
                warnings.simplefilter("ignore")
                for _ in range(done):  # the schedule's position: lr * factor(done)
                    scheduler.step()
            logger.info("resumed pretraining of %s at step %d", progress_dir, done)
        started = time.perf_counter() - spent
        model.train()
        for step, indices in enumerate(
            batch_indices(len(encoded), spec.batch_size, spec.steps, spec.seed), start=1
        ):
            if step <= done:
                continue
            optimizer.zero_grad(set_to_none=True)
            loss, batch_tokens = _step_loss(
                model, [encoded[i] for i in indices], int(tokenizer.pad_token_id),
                spec.micro_batches, device,
            )
            # Clipping keeps the tiny models' early steps (lr 2e-3, no pretraining) stable.
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            losses.append(float(loss))
            tokens += batch_tokens
            if progress is not None:
                progress(step, losses[-1])
            if step % _PROGRESS_EVERY == 0:
                _write_progress(progress_dir, spec, losses, time.perf_counter() - started)
            if step % checkpoint_every == 0 and step < spec.steps:
                checkpoint.save(model, optimizer, step, losses, tokens, time.perf_counter() - started)
    seconds = time.perf_counter() - started
    torch.set_float32_matmul_precision(precision)
    model.eval()
    eval_set = EvalSet(test_records, tokenizer, max_seq_len=spec.max_seq_len)
    metrics = evaluate_model(model, eval_set)
    out = save_pretrained_dir(model.to("cpu"), tokenizer, out_dir)  # type: ignore[arg-type]
    report = {
        "spec": spec.to_json(),
        "spec_hash": spec_hash(spec, corpus),
        "corpus_sha256": corpus,
        "vocab_size": len(tokenizer),
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_records": len(encoded),
        "seconds": seconds,
        "steps_per_second": spec.steps / seconds if seconds > 0 else None,
        "tokens_per_second": tokens / seconds if seconds > 0 else None,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "machine": machine(device),
        "matmul_precision": matmul_precision,
        "final_loss": sum(losses[-10:]) / len(losses[-10:]),
        "loss_curve": _curve(losses),
        "test": metrics,
    }
    (out / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    # A lent GPU machine has no matplotlib: the curve is in the report all the same.
    if importlib.util.find_spec("matplotlib") is not None:
        plot_curve(report, out / CURVE_PLOT)
    else:
        logger.warning("matplotlib is not installed: no %s (the curve is in %s)", CURVE_PLOT, REPORT_FILE)
    (out / PROGRESS_FILE).unlink(missing_ok=True)
    checkpoint.remove()
    logger.info(
        "pretrained %s (%d parameters) in %.0f s: loss %.3f, test EM %.3f",
        out,
        report["parameters"],
        seconds,
        report["final_loss"],
        metrics["em"],
    )
    return report
