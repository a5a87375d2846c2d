"""FedPT and FedAvg+PT behind the phase interface (paper 002, Algorithm 1).

- ``fedpt``: tenants run FedAvg's client step on the small model (the job's ``model``); the
  provider averages the adapters, builds the proxy-tuned large model (Eq. 3) and distils it
  into the averaged small model on its public KD set (Eq. 5); the distilled adapter is the
  next broadcast.
- ``fedavg-pt``: the same without distillation; proxy-tuning is applied at inference only.

Only the small model's LoRA adapter crosses the boundary. The large model is the provider's:
it is queried for log-probabilities (once per job on the public set, then read from the
provider's store) and appears only in the provider's export, the proxy-tuned composite.
Tenants evaluate the small model on their held-out split; the provider scores generations of
the small and the proxy-tuned model on its held-out public examples (Rouge-L, Dist-3/4).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import torch

from fedtune.algorithms.base import Artifact
from fedtune.algorithms.fedavg.algorithm import LoraFedAlgorithm
from fedtune.algorithms.fedpt import proxy, server
from fedtune.algorithms.fedpt.config import FedPTConfig, LargeHttpConfig
from fedtune.algorithms.fedpt.server import LargeModel, PublicSets
from fedtune.algorithms.registry import register
from fedtune.core.messages import ServerState, Update, prefixed
from fedtune.models import lora as lora_helpers
from fedtune.models.loading import save_pretrained_dir
from fedtune.training.context import ProviderContext

log = logging.getLogger(__name__)

MANIFEST = "fedpt.json"
MANIFEST_FORMAT = 1


@register
class FedPT(LoraFedAlgorithm[FedPTConfig]):
    """Small-model FedAvg plus the provider's proxy-tuning and (fedpt) distillation."""

    @property
    def distils(self) -> bool:
        """Whether the provider distils the proxy into the small model each round (Eq. 5)."""
        return self.config.name == "fedpt" and self.config.kd_steps > 0

    # -- provider-side things kept for the life of the process ------------------------------
    def large(self, ctx: ProviderContext) -> LargeModel:
        """The large model (loaded or connected once, vocabulary checked)."""
        return ctx.memo("fedpt-large", lambda: server.open_large_model(self.config.large_model, ctx))

    def public(self, ctx: ProviderContext) -> PublicSets | None:
        """The KD set and held-out public examples; None for fedavg-pt without public data."""
        if not self.distils and not ctx.public_data_uri:
            return None
        kd_size = self.config.kd_size if self.distils else 0
        return ctx.memo("fedpt-public", lambda: server.public_sets(ctx, self.config, kd_size))

    def small_pre(self, ctx: ProviderContext) -> proxy.ModelLogits:
        """The small pre-trained model, a copy without LoRA (the cached base is PEFT-wrapped)."""

        def build() -> proxy.ModelLogits:
            model, tokenizer = ctx.build_base()
            model.eval()
            return proxy.ModelLogits(model, vocab_size=len(tokenizer), name="small pre-trained")

        return ctx.memo("fedpt-small-pre", build)

    def _large_logprobs(
        self, ctx: ProviderContext, sets: PublicSets
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
        return server.large_logprobs(ctx, self.large(ctx), sets, self.config.kd_batch_size)

    # -- provider phases ----------------------------------------------------------------------
    def init_state(self, ctx: ProviderContext) -> ServerState:
        """Check everything FedPT needs before round 1, query the large model once, then
        FedAvg's initial adapter."""
        proxy.check_alpha(self.config.alpha)
        self.large(ctx)
        sets = self.public(ctx)
        queried = 0
        if sets is not None:
            queried = self._large_logprobs(ctx, sets)[2]
        state = super().init_state(ctx)
        state.meta["large_queries"] = queried
        return state

    def aggregate(
        self,
        ctx: ProviderContext,
        state: ServerState,
        updates: dict[str, Update],
        round_index: int,
    ) -> ServerState:
        """FedAvg of the small adapters, then Eq. 5 distillation (fedpt) and evaluation."""
        averaged = super().aggregate(ctx, state, updates, round_index)
        adapter = averaged.group("adapter")
        metrics: dict[str, float] = {}
        queried = 0
        sets = self.public(ctx)
        if self.distils and sets is not None:
            adapter, metrics, queried = self._distil(ctx, sets, adapter, round_index)
        if sets is not None and round_index % self.config.eval_every == 0:
            metrics.update(self._generation_metrics(ctx, sets, adapter))
        metrics["fedpt/large_queries"] = float(queried)
        return ServerState(
            tensors=prefixed("adapter", adapter),
            meta={
                "round": round_index,
                "large_queries": int(state.meta.get("large_queries", 0)) + queried,
                "metrics": metrics,
            },
        )

    def _distil(
        self,
        ctx: ProviderContext,
        sets: PublicSets,
        adapter: dict[str, torch.Tensor],
        round_index: int,
    ) -> tuple[dict[str, torch.Tensor], dict[str, float], int]:
        pad_id = ctx.tokenizer().pad_token_id
        size = self.config.kd_batch_size
        kd_large, held_large, queried = self._large_logprobs(ctx, sets)
        pre = self.small_pre(ctx)
        student = ctx.peft_model(adapter)
        small = proxy.ModelLogits(student, vocab_size=len(ctx.tokenizer()))

        def teacher_of(rows: list[Any], large_lp: list[torch.Tensor]) -> tuple[list[Any], list[Any]]:
            small_lp = server.score_rows(small.logits, rows, pad_id, size)
            pre_lp = server.score_rows(pre.logits, rows, pad_id, size)
            return server.proxy_teacher(large_lp, pre_lp, small_lp, self.config.alpha), small_lp

        teacher, _ = teacher_of(sets.kd, kd_large)
        metrics: dict[str, float] = {}
        held_teacher: list[torch.Tensor] = []
        if sets.heldout:
            held_teacher, held_small = teacher_of(sets.heldout, held_large)
            metrics["kd/heldout_kl_before"] = server.kl_rows(held_teacher, held_small)
        result = server.distill(
            ctx,
            self.config,
            student,
            lora_helpers.trainable_parameters(student),
            sets.kd,
            teacher,
            round_index,
        )
        metrics.update(result.metrics)
        if sets.heldout:
            after = server.score_rows(small.logits, sets.heldout, pad_id, size)
            metrics["kd/heldout_kl_after"] = server.kl_rows(held_teacher, after)
        return result.adapter, metrics, queried

    def _generation_metrics(
        self, ctx: ProviderContext, sets: PublicSets, adapter: dict[str, torch.Tensor]
    ) -> dict[str, float]:
        n = min(self.config.max_generation_examples, len(sets.heldout))
        if n == 0:
            return {}
        rows = sets.heldout[:n]
        references = [e.response for e in sets.heldout_examples[:n]]
        tokenizer = ctx.tokenizer()
        small = ctx.peft_model(adapter)
        eos = tokenizer.eos_token_id
        max_new = self.config.max_new_tokens
        large = self.large(ctx).source
        pre = self.small_pre(ctx)

        def small_only(ids: list[int]) -> list[int]:
            # alpha 1 with the large model replaced by the small pre-trained one gives exactly
            # the tuned small model's logits; one decoding routine for both.
            return proxy.generate(pre, pre, small, ids, 1.0, max_new_tokens=max_new, eos_token_id=eos)

        def proxied(ids: list[int]) -> list[int]:
            return proxy.generate(
                large, pre, small, ids, self.config.alpha, max_new_tokens=max_new, eos_token_id=eos
            )

        metrics = server.generation_metrics(tokenizer, rows, references, small_only, "eval/small")
        metrics.update(server.generation_metrics(tokenizer, rows, references, proxied, "eval/proxy"))
        return metrics

    # -- export ------------------------------------------------------------------------------
    def export(
        self, ctx: ProviderContext, state: ServerState, out_dir: Path
    ) -> dict[str, Artifact]:
        """``small``: the small model (base + adapter), registered as ``<name>-small``;
        ``model``: the proxy-tuned composite (large + small base + adapter + alpha) with its
        manifest, registered as ``<name>``. Against an HTTP large model the composite holds
        the endpoint's address only and is not registered (it cannot be served offline)."""
        small = super().export(ctx, state, out_dir)["model"]
        small_art = Artifact(
            kind="base-with-adapter", path=small.path, register=True, tags=dict(small.tags)
        )
        composite = out_dir / "proxy"
        composite.mkdir(parents=True, exist_ok=True)
        shutil.copytree(small.path, composite / "small", dirs_exist_ok=True)
        large = self.large(ctx)
        manifest: dict[str, Any] = {
            "format": MANIFEST_FORMAT,
            "algorithm": self.config.name,
            "alpha": self.config.alpha,
            "small": "small",
            "rounds": int(state.meta.get("round", 0)),
        }
        config = self.config.large_model
        if isinstance(config, LargeHttpConfig):
            manifest["large"] = {"endpoint": config.url, "model": config.model, "top_k": config.top_k}
        else:
            assert large.local_model is not None
            save_pretrained_dir(large.local_model, large.tokenizer, composite / "large")
            manifest["large"] = "large"
        (composite / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        tags = {
            **small.tags,
            "fedtune.layout": "proxy-tuned",
            "alpha": str(self.config.alpha),
        }
        return {
            "model": Artifact(
                kind="proxy-tuned",
                path=composite,
                register=not isinstance(config, LargeHttpConfig),
                tags=tags,
            ),
            "small": small_art,
        }
