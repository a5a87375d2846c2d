"""The engine's client step against a bare PyTorch + PEFT loop, measured side by side.

The engine's real client step (read the broadcast from the store, load the adapter, tokenize
the tenant's data, train, write the update with its checksums) runs against a bare loop over
the very same batches, model, LoRA settings and optimizer. Repetitions alternate which one
runs first and the ratio is the median of the per-pair ratios, so load from other processes
hits both sides alike. Both end with the same adapter (``max_abs_diff``): they did the same
work. The engine places nothing on a GPU in this version, so both sides run on the CPU.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import torch

from fedtune.benchmarks.jobs import bench_job
from fedtune.benchmarks.suite import load_manifest
from fedtune.benchmarks.workspace import Workspace
from fedtune.core.messages import Broadcast, Update
from fedtune.data.tokenize import collate
from fedtune.engines import layout, steps
from fedtune.models.loading import load_pretrained
from fedtune.models.lora import DEFAULT_TARGETS
from fedtune.training.context import derive_seed
from fedtune.training.local import batch_indices

if TYPE_CHECKING:
    from fedtune.benchmarks.system import SystemSpec

__all__ = ["CLIENT_STEP_AIM", "client_step_vs_bare"]

Log = Callable[[str], None]

CLIENT_STEP_AIM: Final = 1.05


class _BareLoop:
    """The same training as a client step, written the way a PyTorch + PEFT user would."""

    def __init__(
        self, model_dir: Path, spec: SystemSpec, encoded: list[dict[str, list[int]]], seed: int
    ) -> None:
        from peft import LoraConfig, get_peft_model

        base, tokenizer = load_pretrained(str(model_dir))
        for param in base.parameters():
            param.requires_grad_(False)
        self.model = get_peft_model(
            base,
            LoraConfig(
                r=spec.lora_r,
                lora_alpha=spec.lora_alpha,  # type: ignore[arg-type]  # floats work
                lora_dropout=0.0,
                target_modules=list(spec.lora_targets or DEFAULT_TARGETS["llama"]),
                task_type="CAUSAL_LM",
            ),
        )
        self.pad_id = int(tokenizer.pad_token_id)
        self.encoded = encoded
        self.spec = spec
        self.seed = seed

    def run(self, initial: Mapping[str, torch.Tensor]) -> tuple[float, dict[str, torch.Tensor]]:
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        set_peft_model_state_dict(self.model, dict(initial))
        started = time.perf_counter()
        params = [p for p in self.model.parameters() if p.requires_grad]
        # The job's optimizer as the engine builds it: AdamW without weight decay (torch's
        # default is 0.01), or plain SGD.
        optimizer: torch.optim.Optimizer = (
            torch.optim.SGD(params, lr=self.spec.lr)
            if self.spec.optimizer == "sgd"
            else torch.optim.AdamW(params, lr=self.spec.lr, weight_decay=0.0)
        )
        self.model.train()
        for indices in batch_indices(
            len(self.encoded), self.spec.batch_size, self.spec.steps, self.seed
        ):
            batch = collate([self.encoded[i] for i in indices], self.pad_id)
            loss = self.model(**batch).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        self.model.eval()
        state = {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model).items()}
        return time.perf_counter() - started, state


def client_step_vs_bare(workspace: Workspace, spec: SystemSpec, log: Log) -> dict[str, Any]:
    """Interleaved, paired timings of the engine's client step and the bare loop."""
    model_dir = workspace.require_model(spec.model)
    manifest = load_manifest(workspace.suite_dir)
    tenant = max(manifest["tenants"], key=lambda t: manifest["tenants"][t]["records"])
    with tempfile.TemporaryDirectory(prefix="fedtune-system-") as tmp:
        job = bench_job(
            spec,
            name="sys-client-step",
            algorithm="fedavg",
            model_dir=model_dir,
            suite_dir=workspace.suite_dir,
            tenants=[tenant],
            workdir=Path(tmp),
            seed=0,
            rounds=1,
            local_steps=spec.steps,
        )
        provider = steps.ProviderEnv.create(job)
        steps.init_step(provider)
        steps.configure_step(provider, 1)
        env = steps.TenantEnv.create(job, tenant)
        exchange = env.exchange
        key = layout.update_key(1)
        initial = Broadcast.load(exchange, layout.round_broadcast_key(1)).group("adapter")
        encoded = env.ctx.encode(env.data().train)
        seed = derive_seed(job.seed, "train", 1, tenant)
        tokens = sum(
            len(encoded[i]["input_ids"])
            for idx in batch_indices(len(encoded), spec.batch_size, spec.steps, seed)
            for i in idx
        )
        bare = _BareLoop(model_dir, spec, encoded, seed)

        def platform_step() -> tuple[float, float]:
            for suffix in (".safetensors", ".json"):
                if exchange.exists(key + suffix):
                    exchange.delete(key + suffix)
            started = time.perf_counter()
            result = steps.client_step(env, 1)
            return time.perf_counter() - started, float(result["meta"]["train_seconds"])

        platform_step()  # warm-up: builds and caches the model, as every later round finds it
        bare.run(initial)
        pairs = []
        for rep in range(spec.reps):
            if rep % 2 == 0:
                whole, train = platform_step()
                bare_seconds, bare_state = bare.run(initial)
            else:
                bare_seconds, bare_state = bare.run(initial)
                whole, train = platform_step()
            pairs.append((whole, train, bare_seconds))
            log(
                f"client step rep {rep + 1}/{spec.reps}: engine {whole:.3f} s, bare {bare_seconds:.3f} s"
            )
        update = Update.load(exchange, key).group("adapter")
        max_diff = max(float((update[k] - bare_state[k]).abs().max()) for k in update)
    ratio = statistics.median(w / b for w, _, b in pairs)
    train_ratio = statistics.median(t / b for _, t, b in pairs)
    whole = statistics.median(w for w, _, _ in pairs)
    train = statistics.median(t for _, t, _ in pairs)
    bare_s = statistics.median(b for _, _, b in pairs)
    parameters = sum(p.numel() for p in bare.model.parameters())
    verdict = (
        f"Aim met ({ratio:.3f} <= {CLIENT_STEP_AIM})."
        if ratio <= CLIENT_STEP_AIM
        else f"Aim missed by {100 * (ratio - CLIENT_STEP_AIM):.1f} points: the whole step also "
        f"tokenizes the tenant's data, reads the broadcast and writes the update with checksums "
        f"({whole - train:.3f} s of {whole:.3f} s outside the training loop)."
    )
    return {
        "model": f"{spec.model} + LoRA ({parameters:,} parameters)",
        "device": str(next(bare.model.parameters()).device),
        "tenant": tenant,
        "batch_size": spec.batch_size,
        "steps": spec.steps,
        "reps": spec.reps,
        "tokens": tokens,
        "platform_seconds": whole,
        "platform_train_seconds": train,
        "bare_seconds": bare_s,
        "platform_tokens_per_s": tokens / whole,
        "platform_train_tokens_per_s": tokens / train,
        "bare_tokens_per_s": tokens / bare_s,
        "ratio": ratio,
        "train_ratio": train_ratio,
        "aim": CLIENT_STEP_AIM,
        "pairs": [{"engine": w, "engine_train": t, "bare": b} for w, t, b in pairs],
        "max_abs_diff": max_diff,
        "verdict": verdict,
    }
