"""The phase interface every algorithm implements (see docs/architecture.md).

Provider phases receive a :class:`ProviderContext`, tenant phases a :class:`TenantContext`;
neither can reach the other party's things (the tenant's has no path to ``model.uri``).
An algorithm holds only its own config section. Everything a phase needs arrives as an
argument and everything the next phase needs leaves as a typed :class:`Message`, because on
Kubernetes each phase is a separate pod. Algorithms return metrics; they never log them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from fedtune.aggregation import TensorSpec, WeightMode, client_weights, validate_update
from fedtune.config.capabilities import Capabilities
from fedtune.core.errors import ModelError
from fedtune.core.messages import Broadcast, ClientState, ServerState, Update
from fedtune.training.context import ProviderContext, TenantContext, TenantData

C = TypeVar("C")


@dataclass(frozen=True)
class SecureSum:
    """What secure aggregation hands the provider instead of the updates: their weighted mean
    (unmasked from the masked sum; never one tenant's) and each contributor's clear metadata."""

    mean: dict[str, Any]  # update key -> torch.Tensor, as the algorithm's update carries
    total_weight: float
    metas: dict[str, dict[str, Any]]

    def group(self, prefix: str) -> dict[str, Any]:
        """The mean's tensors under ``prefix/``, with the prefix removed (as Message.group)."""
        head = prefix + "/"
        return {k[len(head) :]: v for k, v in self.mean.items() if k.startswith(head)}


SUM_NAME = "secure-sum"
"""The name the unmasked mean goes by where one update stands for every contributor."""


@dataclass(frozen=True)
class Artifact:
    """A final model written by :meth:`Algorithm.export`, as a local directory."""

    kind: str  # e.g. "adapter", "merged", "emulator"
    path: Path
    register: bool = False
    tags: dict[str, str] = field(default_factory=dict)


class Algorithm(ABC, Generic[C]):
    """Four phases plus export. Subclasses register with :func:`fedtune.algorithms.registry.register`."""

    #: Keys under which update tensors are validated against the broadcast.
    update_groups: ClassVar[tuple[str, ...]] = ("adapter",)

    def __init__(self, config: C) -> None:
        self.config = config

    @abstractmethod
    def init_state(self, ctx: ProviderContext) -> ServerState:
        """Provider, once: the state before round 1."""

    @abstractmethod
    def configure_round(
        self, ctx: ProviderContext, state: ServerState, round_index: int
    ) -> Broadcast:
        """Provider, start of a round: what every sampled tenant receives."""

    @abstractmethod
    def client_step(
        self,
        ctx: TenantContext,
        broadcast: Broadcast,
        data: TenantData,
        client_state: ClientState | None,
    ) -> tuple[Update, ClientState | None]:
        """Tenant: train locally; return the update and the state it keeps for itself."""

    @abstractmethod
    def aggregate(
        self,
        ctx: ProviderContext,
        state: ServerState,
        updates: dict[str, Update],
        round_index: int,
    ) -> ServerState:
        """Provider: fold the round's valid updates into the next state."""

    @abstractmethod
    def final_broadcast(self, ctx: ProviderContext, state: ServerState) -> Broadcast:
        """Provider, after the last round: what tenants may see of the final model.

        Tenants evaluate the final model from this, never from a server state (which may hold
        optimizer moments, control variates or provider-side bookkeeping).
        """

    @abstractmethod
    def evaluate(
        self, ctx: TenantContext, broadcast: Broadcast, data: TenantData
    ) -> dict[str, float]:
        """Tenant: metrics of the model in ``broadcast`` on the tenant's held-out split."""

    def finish_kept(
        self, ctx: TenantContext, broadcast: Broadcast, data: TenantData, client_state: ClientState
    ) -> ClientState:
        """Tenant, after the last round, where it keeps a model: the kept state brought to the
        end of the last round from the final ``broadcast`` (FedMKT's last LLM -> SLM transfer).
        The final steps score, export and audit what this returns (default: the state as is)."""
        return client_state

    def kept_model(self, ctx: TenantContext, client_state: ClientState) -> tuple[Any, Any]:
        """Tenant: the model and tokenizer of the kept state :meth:`finish_kept` returned, where
        the tenant keeps a model (what its memorization audit runs).

        Raises:
            ModelError: The algorithm keeps no model of the tenant's.
        """
        raise ModelError(
            f"algorithm {type(self).__name__} keeps no model of the tenant's own",
            fix="Audit the model of the final broadcast (tenant_model) instead.",
        )

    def evaluate_kept(
        self, ctx: TenantContext, data: TenantData, client_state: ClientState
    ) -> dict[str, float]:
        """Tenant, after the last round: metrics of the model it keeps (scalars only)."""
        return {}

    def export_kept(
        self, ctx: TenantContext, client_state: ClientState, out_dir: Path
    ) -> dict[str, Artifact]:
        """Tenant, after the last round: the model it keeps, as local directories that go
        only into the tenant's own store."""
        return {}

    def tenant_broadcast_meta(self, meta: dict[str, Any], tenant: str) -> dict[str, Any] | None:
        """The metadata of ``tenant``'s copy of a broadcast whose provider record has ``meta``,
        where the record holds something for the provider only (the default, None: the copy
        is the record, byte for byte). Built from what the tenant may see, never by removing."""
        return None

    def tenant_model(self, ctx: TenantContext, broadcast: Broadcast) -> tuple[Any, Any]:
        """Tenant: the model and tokenizer that ``broadcast`` lets the tenant run.

        Tenant-side audits (the memorization audit) generate with it. For most algorithms it
        is the final model; where tenants never get that (FedPT's proxy-tuned composite,
        FedBiOT's full model) it is what the final broadcast carries.

        Raises:
            ModelError: The algorithm does not say which model its tenants can run.
        """
        raise ModelError(
            f"algorithm {type(self).__name__} does not define which model a tenant can run "
            "from its final broadcast, so tenant-side audits cannot run for it",
            fix="Implement Algorithm.tenant_model for it, or set `audit.enabled: false`.",
        )

    @abstractmethod
    def export(
        self, ctx: ProviderContext, state: ServerState, out_dir: Path
    ) -> dict[str, Artifact]:
        """Provider, after the last round: the final models as local directories."""

    @property
    def capabilities(self) -> Capabilities:
        """What the algorithm can do, declared once by its config section (see
        :mod:`fedtune.config.capabilities`), which the job validation reads too."""
        return type(self.config).capabilities  # type: ignore[attr-defined, no-any-return]

    @property
    def tenants_load_base(self) -> bool:
        """Whether tenants build the base model (from a tiny config or ``model.tenant_uri``);
        False means tenants get every weight from the broadcast package."""
        return self.capabilities.tenants_load_base

    @property
    def tenant_keeps_model(self) -> bool:
        """Whether each tenant keeps a model of its own in its client state (FedMKT's small
        models): the final evaluate step then also runs :meth:`evaluate_kept` and
        :meth:`export_kept` on the tenant's last client state, in the tenant's process."""
        return self.capabilities.tenant_keeps_model

    def expected_update_shapes(self, broadcast: Broadcast) -> dict[str, TensorSpec]:
        """Names, shapes and dtypes a valid update must carry (checked before aggregation)."""
        specs: dict[str, TensorSpec] = {}
        for group in self.update_groups:
            for name, tensor in broadcast.group("adapter").items():
                specs[f"{group}/{name}"] = TensorSpec(tuple(tensor.shape), tensor.dtype)
        return specs

    def check_update(self, tenant: str, update: Update, broadcast: Broadcast, max_bytes: int) -> None:
        """Refuse an update that may not enter aggregation (keys, shapes, values, size).

        Raises:
            UpdateRejected: Naming the tenant and every problem found.
        """
        validate_update(tenant, update.tensors, self.expected_update_shapes(broadcast), max_bytes)

    def sum_weight(self, update: Update) -> float:
        """A tenant's weight in the securely summed mean (it multiplies its update by it
        before masking): num_samples, or 1 with ``aggregation_weights: uniform``."""
        mode = getattr(self.config, "aggregation_weights", "samples")
        return float(update.meta["num_samples"]) if mode == "samples" else 1.0

    def aggregate_sum(
        self, ctx: ProviderContext, state: ServerState, summed: SecureSum, round_index: int
    ) -> ServerState:
        """Provider, under secure aggregation: fold the weighted mean into the next state.

        Valid for every algorithm whose :meth:`aggregate` is a weighted mean of the update
        tensors (the config declares ``summed_update``): the mean enters as one update.
        Algorithms that need more than the mean (SCAFFOLD's ``|S|``, FedBiOT's per-tenant
        package versions) override it.
        """
        weight = max(int(round(summed.total_weight)), 1)
        single = Update(tensors=dict(summed.mean), meta={"num_samples": weight})
        return self.aggregate(ctx, state, {SUM_NAME: single}, round_index)

    def client_weights(self, updates: dict[str, Update], names: list[str]) -> list[float]:
        """Weights of ``names``' updates in the mean: by num_samples, or uniform by config."""
        mode: WeightMode = getattr(self.config, "aggregation_weights", "samples")
        return client_weights(mode, [int(updates[n].meta["num_samples"]) for n in names])

    def params(self) -> dict[str, Any]:
        """Hyperparameters to record with the run."""
        dump = getattr(self.config, "model_dump", None)
        return dump() if callable(dump) else {}
