"""FedBiOT and its baselines behind the phase interface: one class, three splits.

- ``fedbiot`` (Wu et al. 2024, "FedBiOT: LLM Local Fine-tuning in Federated Learning without
  Full Model", Algorithm 1): adapter = last ``adapter_size`` layers (Algorithm 2), client loss
  Eq. 1 with the proximal weight ``eps``, ``align_steps`` of Eq. 2 per round.
- ``fedot`` (Kuang et al. 2023): adapter = first 2 + last 2 layers, the emulator distilled
  once before training (``pre_distill_steps``), never realigned, no proximal term.
- ``offsite-tuning`` (Xiao et al. 2023): FedOT with a single tenant holding all the data.

Evaluation without moving data or E*: AdapEmu is evaluated by each tenant on its own held-out
split inside the client step (every ``eval_every`` rounds; loss, and GSM8K exact match with the
paper's 8-shot prompt); AdapFu, which needs E*, is evaluated by the provider on the held-out
part of its *public* dataset (with the Eq. 2 terms and AdapEmu on the same data, for
comparison). A tenant that wants AdapFu scored on its own data would have to send that data
to the provider; that is a tenant's explicit opt-in and is not implemented.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Generic, TypeVar

from fedtune.algorithms.base import Algorithm, Artifact, SecureSum
from fedtune.algorithms.fedbiot import client, server
from fedtune.algorithms.fedbiot.config import (
    FedBiOTConfig,
    FedOTConfig,
    OffsiteFamilyConfig,
    OffsiteTuningConfig,
)
from fedtune.algorithms.fedbiot.package import Blueprint
from fedtune.algorithms.registry import register
from fedtune.core.errors import ConfigError, ModelError
from fedtune.core.messages import Broadcast, ClientState, ServerState, Update
from fedtune.models.layers import (
    LayerSplit,
    layer_extract,
    locate_layers,
    offsite_split,
)
from fedtune.training.context import ProviderContext, TenantContext, TenantData

C = TypeVar("C", bound=OffsiteFamilyConfig)


class OffsiteFamily(Algorithm[C], Generic[C]):
    """Emulator + adapter federated tuning; subclasses choose the split and the schedule."""

    def split(self, num_layers: int) -> LayerSplit:
        """Which layers form the adapter and the emulator."""
        return offsite_split(num_layers, self.config.dropout)

    @property
    def eps(self) -> float:
        """Proximal weight of the client loss (Eq. 1)."""
        return 0.0

    @property
    def align_steps(self) -> int:
        """Emulator alignment steps per round."""
        return 0

    def adapter_size_tag(self) -> str:
        """The adapter size as recorded in tags."""
        return "first2+last2"

    def check_job(self, ctx: ProviderContext) -> None:
        """Reject job shapes the algorithm does not define."""

    def provider(self, ctx: ProviderContext) -> server.Provider:
        """The provider's view of the model under this algorithm's split."""
        layout = locate_layers(ctx.base_model())
        return server.Provider.create(self.config, ctx, self.split(layout.num_layers))

    # -- provider ---------------------------------------------------------------------------
    def init_state(self, ctx: ProviderContext) -> ServerState:
        self.check_job(ctx)
        return server.initial_state(self.provider(ctx), self.align_steps)

    def configure_round(
        self, ctx: ProviderContext, state: ServerState, round_index: int
    ) -> Broadcast:
        return server.broadcast(self.provider(ctx), state, round_index)

    def aggregate(
        self,
        ctx: ProviderContext,
        state: ServerState,
        updates: dict[str, Update],
        round_index: int,
    ) -> ServerState:
        provider = self.provider(ctx)
        metas = {n: u.meta for n, u in updates.items()}
        adapter = server.mean_adapter(provider, updates)
        return server.next_state(provider, state, adapter, metas, round_index, self.align_steps)

    def aggregate_sum(
        self, ctx: ProviderContext, state: ServerState, summed: SecureSum, round_index: int
    ) -> ServerState:
        """The unmasked mean adapter; package versions come from the clear metadata."""
        return server.next_state(
            self.provider(ctx), state, summed.group("adapter"), summed.metas, round_index, self.align_steps
        )

    def final_broadcast(self, ctx: ProviderContext, state: ServerState) -> Broadcast:
        return server.final_broadcast(self.provider(ctx), state)

    def export(
        self, ctx: ProviderContext, state: ServerState, out_dir: Path
    ) -> dict[str, Artifact]:
        tags = {
            "algorithm": str(getattr(self.config, "name", type(self).__name__.lower())),
            "round": str(state.meta.get("round", 0)),
            "dropout": str(self.config.dropout),
            "adapter_size": self.adapter_size_tag(),
            "adapter_training": self.config.adapter_training,
        }
        return server.export(self.provider(ctx), state, out_dir, tags)

    # -- tenant -----------------------------------------------------------------------------
    def client_step(
        self,
        ctx: TenantContext,
        broadcast: Broadcast,
        data: TenantData,
        client_state: ClientState | None,
    ) -> tuple[Update, ClientState | None]:
        return client.client_step(self.config, self.eps, ctx, broadcast, data, client_state)

    def evaluate(
        self, ctx: TenantContext, broadcast: Broadcast, data: TenantData
    ) -> dict[str, float]:
        """AdapEmu on the tenant's held-out split, from a self-contained (final) broadcast."""
        model, _ = self.tenant_model(ctx, broadcast)
        metrics = client.evaluate_adapemu(ctx, model, data, self.config)
        if "adapemu/eval_loss" in metrics:
            metrics["eval_loss"] = metrics["adapemu/eval_loss"]
        return metrics

    def tenant_model(self, ctx: TenantContext, broadcast: Broadcast) -> tuple[Any, Any]:
        """AdapEmu (the emulator with the adapter) and the package's tokenizer: tenants never
        hold the provider's full model, so this is what a tenant-side audit can run."""
        if not broadcast.meta.get("has_full"):
            raise ModelError(
                f"round {broadcast.meta.get('round')}: the broadcast to evaluate carries no full "
                "package",
                fix="Evaluate the final broadcast (final_broadcast), which always carries one.",
            )
        blueprint = Blueprint.from_json(broadcast.meta["blueprint"], ctx.runtime)
        ctx.adopt_tokenizer(broadcast.group("tokenizer"))
        model = client.adapemu(
            blueprint,
            broadcast.group("full"),
            broadcast.group("adapter"),
            ctx.lora_config,
            self.config.adapter_training == "lora",
        )
        return model, ctx.tokenizer()


@register
class FedBiOT(OffsiteFamily[FedBiOTConfig]):
    """Last-layers adapter, proximal client term, per-round emulator alignment."""

    def split(self, num_layers: int) -> LayerSplit:
        if self.config.adapter_placement == "edges":
            return offsite_split(num_layers, self.config.dropout, self.config.adapter_size // 2)
        return layer_extract(num_layers, self.config.adapter_size, self.config.dropout)

    @property
    def eps(self) -> float:
        return self.config.eps

    @property
    def align_steps(self) -> int:
        return self.config.align_steps

    def adapter_size_tag(self) -> str:
        if self.config.adapter_placement == "edges":
            half = self.config.adapter_size // 2
            return f"first{half}+last{half}"
        return str(self.config.adapter_size)


@register
class FedOT(OffsiteFamily[FedOTConfig]):
    """First-2 + last-2 adapter, one-shot distillation, FedAvg of adapters."""


@register
class OffsiteTuning(OffsiteFamily[OffsiteTuningConfig]):
    """FedOT with exactly one tenant that holds all the data."""

    def check_job(self, ctx: ProviderContext) -> None:
        if ctx.num_tenants != 1:
            raise ConfigError(
                f"offsite-tuning is single-client, but the job has {ctx.num_tenants} tenants",
                fix="Give the job one tenant whose data_uri holds all the data (e.g. "
                "examples/data/quickstart/all.jsonl), or use algorithm name fedot.",
            )
