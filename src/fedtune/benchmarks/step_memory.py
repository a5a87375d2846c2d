"""Peak memory and speed of each step kind of a 1B-class Llama, fp32 vs bf16, with and
without gradient checkpointing (``fedtune bench system --parts steps-memory``).

Step kinds, each driven through fedtune's own code with the job's
:class:`~fedtune.training.precision.Runtime` (so the figures describe the product):

- ``client``: LoRA training, :func:`~fedtune.training.local.train_local` on a model wrapped
  by :func:`~fedtune.models.lora.apply_lora` on every linear layer (AdamW, as the clients).
- ``provider``: the provider's full-parameter training with a frozen teacher forward,
  FedBiOT's emulator alignment :func:`~fedtune.algorithms.fedbiot.alignment.align` (SGD, the
  paper's optimizer, KL lambda 1): the teacher is the whole model, the student an emulator
  with half its layers, whose decoder layers are trained.
- ``generate``: greedy decoding, :func:`~fedtune.eval.generation.generate_greedy`.
- ``eval``: held-out loss, :func:`~fedtune.eval.loss.lm_eval_loss`.

Models are built as the job builds them (weights created in the precision's dtype, frozen,
placed by the runtime; random weights: memory and speed depend on shapes, not values), and
each cell runs in a fresh process, as :mod:`fedtune.benchmarks.server_memory` does: the
peak is the process's high-water mark (CPU: ``VmHWM``, reset once the models and batches are
built, so it counts the model plus what the step adds; CUDA:
``torch.cuda.max_memory_allocated``). Processes fork from a forkserver that imported the
libraries once (a fork that never ran torch, so each cell still starts clean), which saves
the imports per cell.

On CUDA the same cells run again, and the client step's tokens/s and MFU are measured against
a bare PEFT loop (:func:`client_flops_per_token` gives the FLOPs formula), in the
:data:`VARIANTS` asked for (``training.compile``, ``training.kernels: liger``, both).
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import torch

from fedtune.algorithms.fedbiot.alignment import AlignPlan, Pair, align
from fedtune.benchmarks.jobs import ALL_LINEAR
from fedtune.benchmarks.server_memory import reset_peak, status_kib
from fedtune.config.job import TrainingConfig
from fedtune.core.devices import check_acceleration
from fedtune.core.errors import ConfigError
from fedtune.eval.generation import generate_greedy
from fedtune.eval.loss import lm_eval_loss
from fedtune.models.lora import apply_lora, trainable_parameters
from fedtune.models.tiny import build_tiny_model
from fedtune.models.tokenizer import load_tokenizer
from fedtune.training.local import Batch, train_local
from fedtune.training.precision import Runtime

__all__ = [
    "KINDS",
    "NO_GPU",
    "SHAPES",
    "LlamaShape",
    "VARIANTS",
    "StepMemorySpec",
    "client_flops_per_token",
    "measure",
    "mfu",
    "peak_bf16_flops",
]

logger = logging.getLogger(__name__)

Log = Callable[[str], None]

_MIB: Final = 2**20
KINDS: Final = ("client", "provider", "generate", "eval")
TRAINING_KINDS: Final = ("client", "provider")  # the kinds gradient checkpointing applies to
NO_GPU: Final = "no GPU available: GPU rows not measured"
# The client step's speed variants: name -> (training.compile, training.kernels).
VARIANTS: Final[dict[str, tuple[bool, str]]] = {
    "plain": (False, "none"),
    "compile": (True, "none"),
    "liger": (False, "liger"),
    "compile+liger": (True, "liger"),
}

# Dense bf16 tensor-core peaks from the vendors' data sheets (FLOP/s), keyed by a part of
# torch.cuda.get_device_name(); the longest matching key wins ("H100 PCIe" before "H100").
PEAK_BF16: Final[dict[str, float]] = {
    "H100 PCIe": 756e12,
    "H100": 989e12,  # SXM
    "H200": 989e12,
    "A100": 312e12,
}


@dataclass(frozen=True)
class LlamaShape:
    """A Llama's shape (multi-head attention, untied embeddings, as the tiny models)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    vocab_size: int

    def parameters(self, num_layers: int | None = None) -> int:
        """Parameters (embeddings, the decoder layers' matrices and norms, the LM head)."""
        d, layers = self.hidden_size, self.num_layers if num_layers is None else num_layers
        per_layer = 4 * d * d + 3 * d * self.intermediate_size + 2 * d
        return 2 * self.vocab_size * d + layers * per_layer + d

    def describe(self) -> str:
        """One line for reports."""
        return (
            f"Llama hidden {self.hidden_size}, {self.num_layers} layers, {self.num_heads} heads, "
            f"intermediate {self.intermediate_size}, vocab {self.vocab_size} "
            f"({self.parameters() / 1e9:.2f} B parameters)"
        )


SHAPES: Final[dict[str, LlamaShape]] = {
    # TinyLlama-1.1B's widths with 16 layers and full multi-head attention: 0.95 B parameters.
    "1b": LlamaShape(2048, 16, 32, 5632, 32000),
    # The same family at a quarter of the width and half the depth (0.17 B): fits a busy CPU.
    "170m": LlamaShape(1024, 8, 16, 2816, 32000),
    # Llama-2-7B's shape (6.74 B parameters): 13.5 GB of bf16 weights, built on the GPU.
    "7b": LlamaShape(4096, 32, 32, 11008, 32000),
    # For the tests: the vocabulary keeps the embeddings the bulk, as in the real shapes.
    "tiny": LlamaShape(512, 2, 8, 1376, 32000),
}


@dataclass(frozen=True)
class StepMemorySpec:
    """What the step-memory part measures (sizes are stated in every report)."""

    shape: str = "1b"
    batch_size: int = 1
    seq_len: int = 128
    steps: int = 3  # per cell; the first is not timed (it allocates optimizer state)
    new_tokens: int = 16  # generated per prompt
    lora_r: int = 16
    kinds: tuple[str, ...] = KINDS
    precisions: tuple[str, ...] = ("fp32", "bf16")
    threads: int = 1  # CPU threads per cell (timings: pinned to 1)
    timeout_s: float = 3600.0  # per cell
    gpu: bool = True  # also measure on CUDA where present
    cpu: bool = True  # the CPU cells (off: a GPU machine's lease measures only the CUDA rows)
    # GPU client-step speed against a bare PEFT loop (bf16, no checkpointing).
    speed_batch_size: int = 8
    speed_seq_len: int = 1024
    speed_steps: int = 20
    speed_reps: int = 3
    speed_variants: tuple[str, ...] = ("plain",)  # keys of VARIANTS, one fresh process each
    speed_compiled_bare: bool = True  # the torch.compile'd bare loop (CUDA, plain variant)
    speed_budget_s: float = 86400.0  # wall time for all variants; later ones are skipped
    memory_cells: bool = True  # off: only the client speed (on CPU too, where asked for)

    @property
    def llama(self) -> LlamaShape:
        """The model shape named by ``shape``."""
        return SHAPES[self.shape]

    def cell_base(self, device: str) -> dict[str, Any]:
        """What every cell on ``device`` shares: the shape and the sizes."""
        return {
            "device": device,
            "shape": asdict(self.llama),
            **{k: v for k, v in asdict(self).items()
               if k not in ("shape", "kinds", "precisions", "speed_variants")},
        }

    def cells(self, device: str) -> list[dict[str, Any]]:
        """One measurement each: kind x precision (x checkpointing for training kinds)."""
        base = self.cell_base(device)
        cells = []
        for kind in self.kinds:
            for precision in self.precisions:
                for checkpointing in (False, True) if kind in TRAINING_KINDS else (False,):
                    cells.append(
                        {**base, "kind": kind, "precision": precision, "checkpointing": checkpointing}
                    )
        return cells

    def describe(self) -> str:
        """One line for reports."""
        return (
            f"{self.llama.describe()}, random weights; batch {self.batch_size} x {self.seq_len} "
            f"tokens, {self.steps} steps per cell (the first untimed), generation "
            f"{self.new_tokens} new tokens per prompt, LoRA r {self.lora_r} on every linear layer"
        )


# -- FLOPs and MFU ------------------------------------------------------------------------------
def client_flops_per_token(
    *, frozen_matmul: int, trainable: int, num_layers: int, hidden_size: int, seq_len: int
) -> int:
    """Model FLOPs per token of a LoRA training step (recomputation not counted).

    ``4 * frozen_matmul + 6 * trainable + 12 * num_layers * seq_len * hidden_size``:
    every weight matrix costs 2 FLOPs per parameter forward and 2 backward for the gradient of
    its input; only trained ones (the LoRA factors) cost 2 more for their own gradient. Frozen
    base matrices therefore count 4 (not the 6 of full training), LoRA's 6. Attention scores
    and their weighted sum add 4·T·d per layer forward and twice that backward (PaLM's
    12·L·H·Q·T, no causal halving). ``frozen_matmul`` counts the base's matrices that
    multiply (LM head included, the embedding lookup not).
    """
    return 4 * frozen_matmul + 6 * trainable + 12 * num_layers * seq_len * hidden_size


def peak_bf16_flops(device_name: str) -> float | None:
    """Dense bf16 peak of a GPU from :data:`PEAK_BF16`, or None for a GPU not in it."""
    matches = [k for k in PEAK_BF16 if k.lower() in device_name.lower()]
    return PEAK_BF16[max(matches, key=len)] if matches else None


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the device's peak."""
    return tokens_per_s * flops_per_token / peak_flops


# -- one cell, in its own process ---------------------------------------------------------------
def _clock(device: torch.device) -> Callable[[], float]:
    def now() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    return now


def _timed(batches: Iterable[Batch], marks: list[float], now: Callable[[], float]) -> Iterator[Batch]:
    """``batches``, noting the time of every request: consecutive marks bound one step."""
    for batch in batches:
        marks.append(now())
        yield batch
    marks.append(now())


def _batches(shape: LlamaShape, batch_size: int, seq_len: int, count: int) -> list[Batch]:
    generator = torch.Generator().manual_seed(1)
    out = []
    for _ in range(count):
        ids = torch.randint(3, shape.vocab_size, (batch_size, seq_len), generator=generator)
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()})
    return out


def _base(shape: LlamaShape, runtime: Runtime, tokenizer: Any, *, num_layers: int | None = None,
          seed: int = 0, max_positions: int = 256) -> Any:
    """A frozen base model as :func:`fedtune.training.context.build_model` builds one, except
    that the random weights are created on the runtime's device (values do not matter here):
    initialised on the CPU, a 1B GPU cell took about a minute on the first GPU lease; built on
    the GPU, 0.3-1.1 s (each report states its ``build_s``)."""
    with runtime.device:
        model = build_tiny_model(
            "llama",
            vocab_size=shape.vocab_size,
            hidden_size=shape.hidden_size,
            num_layers=shape.num_layers if num_layers is None else num_layers,
            num_heads=shape.num_heads,
            intermediate_size=shape.intermediate_size,
            max_position_embeddings=max_positions,
            seed=seed,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            dtype=runtime.dtype,
        )
    for param in model.parameters():
        param.requires_grad_(False)
    return runtime.place(model)


def _client_model(cell: Mapping[str, Any], shape: LlamaShape, runtime: Runtime, tokenizer: Any,
                  positions: int) -> tuple[Any, dict[str, torch.nn.Parameter]]:
    """The base wrapped with LoRA and prepared by the runtime, as a tenant's context does."""
    model = apply_lora(
        _base(shape, runtime, tokenizer, max_positions=positions),
        r=cell["lora_r"],
        alpha=2.0 * cell["lora_r"],
        dropout=0.0,
        target_modules=list(ALL_LINEAR),
        arch="llama",
        seed=0,
    )
    runtime.prepare(model)
    return model, trainable_parameters(model)


def _training_config(cell: Mapping[str, Any], runtime: Runtime, steps: int, batch: int,
                     seq_len: int) -> TrainingConfig:
    return TrainingConfig(
        local_steps=steps,
        batch_size=batch,
        lr=1e-4,
        optimizer="adamw",
        max_seq_len=max(8, seq_len),
        device=runtime.device.type,  # type: ignore[arg-type]  # "cpu" or "cuda"
        precision=runtime.precision,  # type: ignore[arg-type]
        gradient_checkpointing=runtime.gradient_checkpointing,
        compile=runtime.compile,
        kernels=runtime.kernels,  # type: ignore[arg-type]  # "none" or "liger"
    )


def _prepare(cell: Mapping[str, Any], runtime: Runtime, tokenizer: Any
             ) -> tuple[Callable[[list[float], Callable[[], float]], None], int, dict[str, Any]]:
    """Build what the cell's step needs; return the step (noting marks), its tokens per step
    and facts for the report."""
    shape = LlamaShape(**cell["shape"])
    kind, steps, batch, seq = cell["kind"], cell["steps"], cell["batch_size"], cell["seq_len"]
    positions = max(256, seq + cell["new_tokens"])
    if kind == "client":
        model, params = _client_model(cell, shape, runtime, tokenizer, positions)
        config = _training_config(cell, runtime, steps, batch, seq)
        batches = _batches(shape, batch, seq, steps)

        def client(marks: list[float], now: Callable[[], float]) -> None:
            train_local(model, params, _timed(batches, marks, now), config, seed=0)

        facts = {"parameters": sum(p.numel() for p in model.parameters()),
                 "trainable": sum(p.numel() for p in params.values())}
        return client, batch * seq, facts
    if kind == "provider":
        teacher = _base(shape, runtime, tokenizer, max_positions=positions)
        student = runtime.prepare(
            _base(shape, runtime, tokenizer, num_layers=max(1, shape.num_layers // 2), seed=1,
                  max_positions=positions)
        )
        trained = [n for n, _ in student.named_parameters() if ".layers." in n]
        plan = AlignPlan(steps=steps, lr=1e-4, optimizer="sgd", kl_lambda=1.0, normalize_l2=True,
                         runtime=runtime)
        pair = Pair(student, teacher, student_position=-1, teacher_position=-1)
        batches = _batches(shape, batch, seq, steps + 1)  # align asks for one more to stop

        def provider(marks: list[float], now: Callable[[], float]) -> None:
            with runtime.autocast():
                align(pair, trained, _timed(batches, marks, now), plan, seed=0)
            del marks[steps + 1 :]

        named = dict(student.named_parameters())
        facts = {
            "parameters": sum(p.numel() for p in teacher.parameters())
            + sum(p.numel() for p in named.values()),
            "trainable": sum(named[n].numel() for n in trained),
        }
        return provider, batch * seq, facts
    model = _base(shape, runtime, tokenizer, max_positions=positions)
    facts = {"parameters": sum(p.numel() for p in model.parameters()), "trainable": 0}
    if kind == "generate":
        generator = torch.Generator().manual_seed(2)
        prompts = [
            tokenizer.decode(torch.randint(3, len(tokenizer), (seq,), generator=generator).tolist())
            for _ in range(batch)
        ]
        facts["prompt_tokens"] = max(len(tokenizer(p)["input_ids"]) for p in prompts)

        def generate(marks: list[float], now: Callable[[], float]) -> None:
            for _ in range(steps):
                marks.append(now())
                with runtime.autocast():
                    generate_greedy(model, tokenizer, prompts, cell["new_tokens"], batch_size=batch)
            marks.append(now())

        return generate, batch * cell["new_tokens"], facts
    batches = _batches(shape, batch, seq, steps)

    def evaluate(marks: list[float], now: Callable[[], float]) -> None:
        with runtime.autocast():
            lm_eval_loss(model, _timed(batches, marks, now))

    return evaluate, batch * seq, facts


def measure_cell(cell: Mapping[str, Any]) -> dict[str, Any]:
    """One cell in this (fresh) process: build, reset the peak, run the steps, report."""
    device = torch.device(cell["device"])
    if device.type == "cpu":
        torch.set_num_threads(cell["threads"])
    start_kib = status_kib("VmRSS")
    runtime = Runtime(device=device, precision=cell["precision"],
                      gradient_checkpointing=cell["checkpointing"])
    tokenizer = load_tokenizer("builtin")
    started = time.perf_counter()
    step, tokens_per_step, facts = _prepare(cell, runtime, tokenizer)
    build_s = time.perf_counter() - started
    gc.collect()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        built_bytes = torch.cuda.memory_allocated()
    built_kib = status_kib("VmRSS")
    reset = reset_peak()
    marks: list[float] = []
    step(marks, _clock(device))
    durations = [b - a for a, b in zip(marks, marks[1:], strict=False)]
    steady = durations[1:] or durations  # the first step allocates optimizer state, caches
    seconds = sum(steady) / len(steady)
    row: dict[str, Any] = {
        "kind": cell["kind"],
        "precision": cell["precision"],
        "checkpointing": cell["checkpointing"],
        "device": str(device),
        "threads": torch.get_num_threads(),
        **facts,
        "build_s": build_s,
        "steps": len(durations),
        "seconds_per_step": seconds,
        "tokens_per_step": tokens_per_step,
        "tokens_per_s": tokens_per_step / seconds,
    }
    if cuda:
        peak = torch.cuda.max_memory_allocated()
        row.update(peak_mib=peak / _MIB, model_mib=built_bytes / _MIB,
                   added_mib=(peak - built_bytes) / _MIB, measure="torch.cuda.max_memory_allocated")
    elif reset:
        peak_kib = status_kib("VmHWM")
        row.update(peak_mib=peak_kib / 1024, model_mib=(built_kib - start_kib) / 1024,
                   added_mib=(peak_kib - built_kib) / 1024,
                   measure="VmHWM (resident high-water mark), reset after building")
    return row


# -- GPU: the client step's speed against a bare PEFT loop --------------------------------------
def _llama_globals() -> dict[str, Any]:
    from transformers.models.llama import modeling_llama

    return dict(vars(modeling_llama))


@contextlib.contextmanager
def _unpatched(originals: Mapping[str, Any]) -> Iterator[None]:
    """Transformers' Llama module with ``originals`` put back for the duration: Liger patches
    module globals (its RoPE replaces ``apply_rotary_pos_emb`` for every Llama in the
    process), which the bare loop must not run with."""
    from transformers.models.llama import modeling_llama

    patched = {name: getattr(modeling_llama, name) for name in originals}
    for name, value in originals.items():
        setattr(modeling_llama, name, value)
    try:
        yield
    finally:
        for name, value in patched.items():
            setattr(modeling_llama, name, value)


def _skipped(variant: str, device: torch.device) -> str | None:
    """Why ``variant`` cannot run on ``device`` here (liger-kernel missing, no CUDA, ...)."""
    compile_forward, kernels = VARIANTS[variant]
    try:
        check_acceleration(compile_forward, kernels, device.type)
    except ConfigError as exc:
        return str(exc.args[0]) if exc.args else str(exc)
    return None


def measure_client_speed(cell: Mapping[str, Any]) -> dict[str, Any]:
    """fedtune's client step (:func:`train_local`) in the cell's ``variant`` (a key of
    :data:`VARIANTS`: ``training.compile`` and/or ``training.kernels``) against a bare eager
    PEFT loop on the same model shape, batches and optimizer, alternating, ``speed_reps``
    pairs after a first run each (for ``compile`` that run compiles: ``first_run_s``);
    tokens/s (best of the reps) and MFU (:func:`client_flops_per_token`). On CUDA, for the
    plain variant, also the bare loop under ``torch.compile`` (best of ``speed_reps`` after
    its compiling first run), as a reference. A variant this machine cannot run (liger-kernel
    not installed, no GPU) is returned as ``skipped`` with the reason.

    Runs on any device (the tests run it on the CPU at a tiny shape); the benchmark calls it
    on CUDA, and on the CPU only where asked for (``memory_cells`` off).
    """
    from peft import LoraConfig, get_peft_model

    variant = cell.get("variant", "plain")
    compile_forward, kernels = VARIANTS[variant]
    device = torch.device(cell["device"])
    head = {"variant": variant, "compile": compile_forward, "kernels": kernels,
            "device": str(device)}
    reason = _skipped(variant, device)
    if reason is not None:
        return {**head, "skipped": reason}
    runtime = Runtime(device=device, precision=cell["precision"], gradient_checkpointing=False,
                      compile=compile_forward, kernels=kernels)
    tokenizer = load_tokenizer("builtin")
    shape = LlamaShape(**cell["shape"])
    batch, seq, steps = cell["speed_batch_size"], cell["speed_seq_len"], cell["speed_steps"]
    positions = max(256, seq)
    started = time.perf_counter()
    # The bare loop as a PyTorch + PEFT user writes it: its own model of the same shape, built
    # first (Liger replaces Llama's norm and MLP classes for models built after it).
    bare = get_peft_model(
        _base(shape, runtime, tokenizer, max_positions=positions),
        LoraConfig(r=cell["lora_r"], lora_alpha=2 * cell["lora_r"], lora_dropout=0.0,
                   target_modules=list(ALL_LINEAR), task_type="CAUSAL_LM"),
    )
    bare_params = [p for p in bare.parameters() if p.requires_grad]
    before = _llama_globals()
    model, params = _client_model(cell, shape, runtime, tokenizer, positions)
    originals = {k: v for k, v in before.items() if _llama_globals().get(k) is not v}
    config = _training_config(cell, runtime, steps, batch, seq)
    batches = _batches(shape, batch, seq, steps)
    build_s = time.perf_counter() - started
    now = _clock(device)

    def fedtune_run() -> float:
        started = now()
        train_local(model, params, iter(batches), config, seed=0)
        return now() - started

    def bare_run() -> float:
        optimizer = torch.optim.AdamW(bare_params, lr=1e-4, weight_decay=0.0)
        bare.train()
        with _unpatched(originals):
            started = now()
            for item in batches:
                moved = {k: v.to(device) for k, v in item.items()}
                with runtime.autocast():
                    loss = bare(**moved).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            return now() - started

    first_s, bare_first_s = fedtune_run(), bare_run()  # kernels, allocator, caches; compiling
    pairs = []
    for rep in range(cell["speed_reps"]):
        if rep % 2 == 0:
            pairs.append((fedtune_run(), bare_run()))
        else:
            b = bare_run()
            pairs.append((fedtune_run(), b))
    tokens = batch * seq * steps
    compiled: dict[str, float] | None = None
    if device.type == "cuda" and variant == "plain" and cell.get("speed_compiled_bare", True):
        # A reference, not fedtune: what torch.compile makes of the bare loop.
        bare = torch.compile(bare)  # type: ignore[assignment]  # bare_run reads this binding
        compiled_first_s = bare_run()  # compiles
        compiled = {"first_run_s": compiled_first_s,
                    "tokens_per_s": tokens / min(bare_run() for _ in range(cell["speed_reps"]))}
    frozen = sum(p.numel() for n, p in model.named_parameters()
                 if p.dim() == 2 and not p.requires_grad and "embed_tokens" not in n)
    trainable = sum(p.numel() for p in params.values())
    flops = client_flops_per_token(frozen_matmul=frozen, trainable=trainable,
                                   num_layers=shape.num_layers, hidden_size=shape.hidden_size,
                                   seq_len=seq)
    fedtune_tps = tokens / min(f for f, _ in pairs)
    bare_tps = tokens / min(b for _, b in pairs)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = peak_bf16_flops(name) if device.type == "cuda" else None
    if compiled is not None and peak:
        compiled["mfu"] = mfu(compiled["tokens_per_s"], flops, peak)
    return {
        **head,
        "device": name,
        "precision": cell["precision"],
        "batch_size": batch,
        "seq_len": seq,
        "steps": steps,
        "reps": cell["speed_reps"],
        "build_s": build_s,
        "first_run_s": first_s,
        "bare_first_run_s": bare_first_s,
        "frozen_matmul_parameters": frozen,
        "trainable": trainable,
        "flops_per_token": flops,
        "flops_formula": "4*frozen_matmul + 6*trainable + 12*layers*seq_len*hidden",
        "peak_bf16_flops": peak,
        "fedtune_tokens_per_s": fedtune_tps,
        "bare_tokens_per_s": bare_tps,
        "speedup": fedtune_tps / bare_tps,  # the variant's best tokens/s over the bare loop's
        "ratio": statistics.median(f / b for f, b in pairs),  # fedtune time / bare time
        "fedtune_mfu": mfu(fedtune_tps, flops, peak) if peak else None,
        "bare_mfu": mfu(bare_tps, flops, peak) if peak else None,
        "pairs": [{"fedtune": f, "bare": b} for f, b in pairs],
        "compiled_bare": compiled,
        # Both loops' models and the step's peak (CUDA): what the shape needs on the card.
        "peak_mib": torch.cuda.max_memory_allocated(device) / _MIB if device.type == "cuda" else None,
    }


def percent(value: float | None) -> str:
    """A share as ``12.3 %`` (``-`` where unknown: no MFU off a GPU in the peak table)."""
    return "-" if value is None else f"{100 * value:.1f} %"


def speed_summary(row: Mapping[str, Any]) -> str:
    """One line per speed row, for logs."""
    label = f"client speed {row.get('device', '?')} {row.get('variant', 'plain')}"
    if "skipped" in row:
        return f"{label}: skipped ({row['skipped']})"
    if "error" in row:
        return f"{label}: error ({row['error']})"
    return (f"{label}: fedtune {row['fedtune_tokens_per_s']:,.0f} tokens/s (MFU "
            f"{percent(row['fedtune_mfu'])}), bare eager {row['bare_tokens_per_s']:,.0f} "
            f"(MFU {percent(row['bare_mfu'])}), x{row['speedup']:.2f}; first run "
            f"{row['first_run_s']:.1f} s, build {row['build_s']:.1f} s"
            + (f", peak {row['peak_mib']:,.0f} MiB" if row.get("peak_mib") else ""))


# -- orchestration -------------------------------------------------------------------------------
_MEASURES: Final[dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]]] = {
    "cell": measure_cell,
    "speed": measure_client_speed,
}


def _child(what: str, cell: Mapping[str, Any], out: str) -> None:
    """Child entry: one measurement, written as JSON (an error as ``{"error": ...}``)."""
    try:
        result = _MEASURES[what](cell)
    except Exception as exc:  # noqa: BLE001 - reported as the row's error, the others go on
        logger.exception("step-memory cell failed")
        result = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    Path(out).write_text(json.dumps(result), encoding="utf-8")


def _context() -> Any:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


def run_fresh(what: str, cell: Mapping[str, Any], out_dir: Path, timeout_s: float) -> dict[str, Any]:
    """One measurement in a fresh process; its report, or ``{"error": ...}``."""
    out = out_dir / f"{what}-{len(list(out_dir.iterdir()))}.json"
    process = _context().Process(target=_child, args=(what, dict(cell), str(out)))
    process.start()
    process.join(timeout_s)
    if process.is_alive():
        process.kill()
        process.join()
        return {"error": f"timed out after {timeout_s:.0f} s"}
    if process.exitcode != 0 or not out.is_file():
        reason = " (killed: out of memory?)" if process.exitcode == -9 else ""
        return {"error": f"exit {process.exitcode}{reason}"}
    return json.loads(out.read_text("utf-8"))  # type: ignore[no-any-return]


def machine_load() -> dict[str, Any]:
    """Load average and available memory now (other processes share the machine)."""
    available = None
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            available = int(line.split()[1]) / 2**20
    return {"loadavg_1m": os.getloadavg()[0], "cpu_count": os.cpu_count(),
            "mem_available_gib": available}


def _needed_gib(cell: Mapping[str, Any], shape: LlamaShape) -> float:
    """A generous estimate of a cell's memory: weights (and the trained layers' gradients)."""
    width = 4 if cell["precision"] == "fp32" else 2
    weights = shape.parameters()
    if cell["kind"] == "provider":
        student = shape.parameters(max(1, shape.num_layers // 2))
        weights += 2 * student
    return 1.5 * weights * width / 2**30 + 1.0


def _row(cell: Mapping[str, Any], report: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("kind", "precision", "checkpointing", "device")
    return {**{k: cell[k] for k in keys}, **report}


def _save_partial(results: Mapping[str, Any], path: Path | None) -> None:
    """The rows so far, replaced atomically after each cell: a run cut off (a GPU lease that
    ends, a timeout) keeps what it measured."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(path.name + ".tmp")
    scratch.write_text(json.dumps({**results, "partial": True}, indent=1), encoding="utf-8")
    scratch.replace(path)


def _speed(spec: StepMemorySpec, device: str, into: dict[str, Any], out: Path, say: Log,
           save: Callable[[], None]) -> None:
    """The client speed per variant, one fresh process each, saved as each one ends:
    ``into["variants"]``, and the plain one as ``into["client_speed"]`` (as before variants).
    Each process gets ``timeout_s`` or what is left of ``speed_budget_s``, whichever is less:
    a variant over it is an error row, and the record is still written."""
    base = {**spec.cell_base(device), "kind": "client", "precision": "bf16",
            "checkpointing": False}
    into["variants"] = []
    deadline = time.monotonic() + spec.speed_budget_s
    for variant in spec.speed_variants:
        left = deadline - time.monotonic()
        reason = _skipped(variant, torch.device(device))  # no process for what cannot run
        if reason is None and left < 10:
            reason = f"out of time: the speed budget of {spec.speed_budget_s:.0f} s was spent"
        row = {"variant": variant, **(
            {"compile": VARIANTS[variant][0], "kernels": VARIANTS[variant][1], "device": device,
             "skipped": reason} if reason is not None
            else run_fresh("speed", {**base, "variant": variant}, out, min(spec.timeout_s, left)))}
        into["variants"].append(row)
        if variant == "plain":
            into["client_speed"] = row
        save()
        say(speed_summary(row))


def measure(spec: StepMemorySpec, out_dir: str | Path, log: Log | None = None,
            partial: Path | None = None) -> dict[str, Any]:
    """Every CPU cell (unless ``spec.cpu`` is off), one at a time; then the CUDA cells and the
    client speed where CUDA is present, else the :data:`NO_GPU` note. A failed cell carries
    ``error`` instead of numbers. With ``partial``, the results so far are written there after
    every cell (marked ``"partial": true``)."""
    say: Log = log or logger.info
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "description": spec.describe(),
        "spec": asdict(spec),
        "shape": asdict(spec.llama),
        "load_before": machine_load(),
        "rows": [],
    }
    devices = (["cpu"] if spec.cpu else []) + (
        ["cuda"] if spec.gpu and torch.cuda.is_available() else []
    )
    for device in devices:
        for cell in spec.cells(device) if spec.memory_cells else []:
            label = f"{cell['kind']} {cell['precision']}" + (" ckpt" if cell["checkpointing"] else "")
            available = machine_load()["mem_available_gib"]
            needed = _needed_gib(cell, spec.llama)
            if device == "cpu" and available is not None and available < needed:
                report: dict[str, Any] = {
                    "error": f"skipped: needs ~{needed:.1f} GiB, {available:.1f} GiB available"
                }
            else:
                report = run_fresh("cell", cell, out, spec.timeout_s)
            row = _row(cell, report)
            results["rows"].append(row)
            _save_partial(results, partial)
            say(f"steps memory {device} {label}: "
                + (f"peak {row['peak_mib']:,.0f} MiB, {row['tokens_per_s']:,.1f} tokens/s"
                   if "peak_mib" in row else str(row.get("error", "no peak on this system"))))
    if "cuda" in devices:
        results["gpu"] = {"measured": True}
        _speed(spec, "cuda", results["gpu"], out, say, lambda: _save_partial(results, partial))
    else:
        results["gpu"] = {"measured": False, "note": NO_GPU}
        say(NO_GPU)
    if "cpu" in devices and not spec.memory_cells:  # speed only, asked for on the CPU
        results["cpu_speed"] = {}
        _speed(spec, "cpu", results["cpu_speed"], out, say, lambda: _save_partial(results, partial))
    results["load_after"] = machine_load()
    return results

