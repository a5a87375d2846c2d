"""Where a 1B LoRA client step spends its GPU time: variants of the bare PEFT loop (LoRA on
every linear layer vs q/v only, batch size, attention mask, ``torch.compile``) and a kernel
profile. The output behind docs/results/gpu-lease-2026-11-27b/probe-mfu.log.

Run on a GPU machine with fedtune importable (as scripts/gpu_check.sh sets PYTHONPATH):
``python3 scripts/gpu_mfu_probe.py`` (about 100 s on an H100, a minute of it compiling).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence

import torch
from peft import LoraConfig, get_peft_model
from torch.profiler import ProfilerActivity, profile

from fedtune.benchmarks import step_memory as sm
from fedtune.benchmarks.jobs import ALL_LINEAR
from fedtune.models.tokenizer import load_tokenizer
from fedtune.training.precision import Runtime

DEVICE = torch.device("cuda")
RUNTIME = Runtime(device=DEVICE, precision="bf16", gradient_checkpointing=False)
SHAPE = sm.SHAPES["1b"]


def peft_model(targets: Sequence[str]) -> torch.nn.Module:
    base = sm._base(SHAPE, RUNTIME, load_tokenizer("builtin"), max_positions=2048)
    return get_peft_model(base, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                           target_modules=list(targets), task_type="CAUSAL_LM"))


def run(name: str, targets: Sequence[str] = ALL_LINEAR, batch: int = 8, seq: int = 1024,
        steps: int = 10, mask: bool = True, compiled: bool = False, kernels: bool = False) -> None:
    """Tokens/s and MFU of one variant (best of two runs after a warm-up), printed."""
    model = peft_model(targets)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    data = [torch.randint(3, SHAPE.vocab_size, (batch, seq), generator=generator) for _ in range(steps)]
    forward = torch.compile(model) if compiled else model
    model.train()

    def timed(items: list[torch.Tensor]) -> float:
        torch.cuda.synchronize()
        started = time.perf_counter()
        for ids in items:
            ids = ids.to(DEVICE)
            inputs = {"input_ids": ids, "labels": ids}
            if mask:
                inputs["attention_mask"] = torch.ones_like(ids)
            with RUNTIME.autocast():
                loss = forward(**inputs).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        return time.perf_counter() - started

    warm_up = timed(data[:3])
    best = min(timed(data) for _ in range(2))
    frozen = sum(p.numel() for n, p in model.named_parameters()
                 if p.dim() == 2 and not p.requires_grad and "embed_tokens" not in n)
    flops = sm.client_flops_per_token(
        frozen_matmul=frozen, trainable=sum(p.numel() for p in params),
        num_layers=SHAPE.num_layers, hidden_size=SHAPE.hidden_size, seq_len=seq)
    peak = sm.peak_bf16_flops(torch.cuda.get_device_name(DEVICE)) or float("nan")
    tokens_per_s = batch * seq * steps / best
    print(f"{name}: {tokens_per_s:,.0f} tokens/s, MFU {sm.mfu(tokens_per_s, flops, peak):.1%}, "
          f"warm-up {warm_up:.1f}s, peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB",
          flush=True)
    if kernels:
        with profile(activities=[ProfilerActivity.CUDA]) as profiled:
            timed(data[:2])
        print(profiled.key_averages().table(sort_by="cuda_time_total", row_limit=22,
                                            max_name_column_width=60), flush=True)
    del model, forward, optimizer, params
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


if __name__ == "__main__":
    run("all-linear 8x1024", kernels=True)
    run("all-linear 8x1024 no mask", mask=False)
    run("all-linear 16x1024", batch=16)
    run("q,v 8x1024", targets=("q_proj", "v_proj"))
    run("all-linear 8x1024 compiled", compiled=True)
