"""FedAvg on LoRA adapters — the FedIT baseline.

McMahan et al. 2017, "Communication-Efficient Learning of Deep Networks from Decentralized
Data", Algorithm 1: ``w_{t+1} = sum_k (n_k / n) w^k_{t+1}``; applied to LoRA adapters as in
FedIT (Zhang et al. 2024): ``lora_A`` and ``lora_B`` are averaged separately, weighted by
sample counts (which is not the average of ``B @ A``; every reference implementation does the
same). FedProx, SCAFFOLD and FedOPT subclass this and override one hook each.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch

from fedtune.aggregation import weighted_mean
from fedtune.algorithms.base import Algorithm, Artifact
from fedtune.algorithms.fedavg.config import FedAvgConfig
from fedtune.algorithms.registry import register
from fedtune.core.messages import Broadcast, ClientState, ServerState, Update, prefixed
from fedtune.eval.loss import lm_eval_loss
from fedtune.training.context import ProviderContext, TenantContext, TenantData, derive_seed
from fedtune.training.local import (
    Regularizer,
    TrainResult,
    before_training,
    plan_steps,
    train_local,
)

# PEFT and the model loaders are imported inside the phases that build a model: the
# provider's configure and aggregate steps (a process each under KFP) only move tensors.
C = TypeVar("C")


class LoraFedAlgorithm(Algorithm[C], Generic[C]):
    """The FedIT skeleton: global LoRA adapter out, locally trained adapters back."""

    # -- provider ---------------------------------------------------------------------------
    def init_state(self, ctx: ProviderContext) -> ServerState:
        from fedtune.models import lora as lora_helpers

        adapter = lora_helpers.adapter_state(ctx.peft_model())
        return ServerState(tensors=prefixed("adapter", adapter), meta={"round": 0})

    def configure_round(
        self, ctx: ProviderContext, state: ServerState, round_index: int
    ) -> Broadcast:
        return Broadcast(
            tensors=prefixed("adapter", state.group("adapter")), meta={"round": round_index}
        )

    def aggregate(
        self,
        ctx: ProviderContext,
        state: ServerState,
        updates: dict[str, Update],
        round_index: int,
    ) -> ServerState:
        names = sorted(updates)
        mean = weighted_mean(
            [updates[n].group("adapter") for n in names], self.client_weights(updates, names)
        )
        return ServerState(tensors=prefixed("adapter", mean), meta={"round": round_index})

    def final_broadcast(self, ctx: ProviderContext, state: ServerState) -> Broadcast:
        """The global adapter only: no optimizer moments, no control variates."""
        round_index = int(state.meta.get("round", 0))
        return Broadcast(
            tensors=prefixed("adapter", state.group("adapter")),
            meta={"round": round_index + 1, "final": True},
        )

    def export(
        self, ctx: ProviderContext, state: ServerState, out_dir: Path
    ) -> dict[str, Artifact]:
        """The base model as a Hugging Face directory (written once) and the adapter in
        ``adapter/``; with ``export.merged: true`` also a copy with the adapter merged in
        ``merged/``.

        Top-level base weights stay un-merged so that every consumer applies the adapter
        exactly once: the registered pyfunc model and vLLM's LoRA serving alike; ``merged/``
        is what runtimes without LoRA support (and GPT-2 under vLLM) serve. At 7B each full
        copy is ~14 GB, so it is written only when asked for.
        """
        from fedtune.models import lora as lora_helpers
        from fedtune.models.loading import save_pretrained_dir

        model = ctx.peft_model(state.group("adapter"))
        model_dir = out_dir / "model"
        base, tokenizer = ctx.build_base()
        save_pretrained_dir(base, tokenizer, model_dir)
        lora_helpers.save_adapter(model, model_dir / "adapter")
        if ctx.export_merged:
            lora_helpers.merge_and_export(model, tokenizer, model_dir / "merged")
        tags = {
            "algorithm": self.name_tag(),
            "rounds": str(state.meta.get("round", 0)),
            "lora_r": str(ctx.lora_config.r),
            "fedtune.layout": "base+adapter",
        }
        return {"model": Artifact(kind="base-with-adapter", path=model_dir, register=True, tags=tags)}

    def name_tag(self) -> str:
        """The algorithm name recorded in tags."""
        return str(getattr(self.config, "name", type(self).__name__.lower()))

    # -- tenant -----------------------------------------------------------------------------
    def client_step(
        self,
        ctx: TenantContext,
        broadcast: Broadcast,
        data: TenantData,
        client_state: ClientState | None,
    ) -> tuple[Update, ClientState | None]:
        from fedtune.models import lora as lora_helpers

        global_adapter = broadcast.group("adapter")
        model = ctx.peft_model(global_adapter)
        round_index = int(broadcast.meta["round"])
        eval_loss, eval_seconds = before_training("eval", lambda: self._timed_eval(ctx, model, data))
        params = lora_helpers.trainable_parameters(model)
        encoded = ctx.encode(data.train)
        steps = plan_steps(ctx.training, len(encoded))
        seed = derive_seed(ctx.seed, "train", round_index, data.tenant)
        result = train_local(
            model,
            params,
            ctx.train_batches(encoded, steps, seed),
            ctx.training,
            seed=seed,
            regularizer=self.regularizer(global_adapter),
            grad_correction=self.grad_correction(broadcast, client_state),
        )
        trained = lora_helpers.adapter_state(model)
        update = Update(
            tensors=prefixed("adapter", trained),
            meta={
                "num_samples": len(encoded),
                "train_loss": result.loss,
                "eval_loss": eval_loss,
                "steps": result.steps,
                "tokens": result.tokens,
                "train_seconds": result.seconds,
                "eval_seconds": eval_seconds,
            },
        )
        return self.finish_client(ctx, update, trained, broadcast, client_state, result)

    def tenant_model(self, ctx: TenantContext, broadcast: Broadcast) -> tuple[Any, Any]:
        """The tenant-readable base with the broadcast's global adapter."""
        return ctx.peft_model(broadcast.group("adapter")), ctx.tokenizer()

    def evaluate(
        self, ctx: TenantContext, broadcast: Broadcast, data: TenantData
    ) -> dict[str, float]:
        model, _ = self.tenant_model(ctx, broadcast)
        loss = self._eval_loss(ctx, model, data)
        return {} if loss is None else {"eval_loss": loss}

    def _timed_eval(
        self, ctx: TenantContext, model: torch.nn.Module, data: TenantData
    ) -> tuple[float | None, float]:
        started = time.perf_counter()
        return self._eval_loss(ctx, model, data), time.perf_counter() - started

    @staticmethod
    def _eval_loss(ctx: TenantContext, model: torch.nn.Module, data: TenantData) -> float | None:
        if not data.eval:  # eval_fraction 0 or a tiny dataset: nothing held out
            return None
        return lm_eval_loss(model, ctx.eval_batches(ctx.encode(data.eval)))

    # -- hooks the FedIT variants override ----------------------------------------------------
    def regularizer(self, global_adapter: dict[str, torch.Tensor]) -> Regularizer | None:
        """Extra client loss term (FedProx)."""
        return None

    def grad_correction(
        self, broadcast: Broadcast, client_state: ClientState | None
    ) -> dict[str, torch.Tensor] | None:
        """Gradient correction per step (SCAFFOLD)."""
        return None

    def finish_client(
        self,
        ctx: TenantContext,
        update: Update,
        trained: dict[str, torch.Tensor],
        broadcast: Broadcast,
        client_state: ClientState | None,
        result: TrainResult,
    ) -> tuple[Update, ClientState | None]:
        """Add algorithm-specific tensors to the update and the kept state (SCAFFOLD)."""
        return update, client_state


@register
class FedAvg(LoraFedAlgorithm[FedAvgConfig]):
    """Sample-weighted FedAvg of LoRA adapters."""

