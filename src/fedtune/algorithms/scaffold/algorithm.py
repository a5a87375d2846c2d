"""SCAFFOLD with client control variates kept in each tenant's own store.

Karimireddy et al. 2020, "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning",
Algorithm 1 with option II:

* client step, every local step: ``y_i <- y_i - eta_l (g_i(y_i) - c_i + c)`` (line 10);
* ``c_i+ = c_i - c + (x - y_i) / (K eta_l)`` (line 12, option II);
* server: ``x <- x + eta_g * mean_S(y_i - x)``, ``c <- c + (|S|/N) mean_S(c_i+ - c_i)``
  (lines 16-17; FLARE omits the ``|S|/N`` factor, we keep it).

The tenant's ``c_i`` never leaves its store: only ``c_i+ - c_i`` travels. With an optimizer
other than SGD the correction is still added to the gradient, as the paper's analysis assumes
SGD; the FedIT recipe uses AdamW, so document that choice in the job when using SCAFFOLD.
"""

from __future__ import annotations

import torch

from fedtune.aggregation import (
    scaffold_new_client_variate,
    scaffold_server_step,
    scaffold_server_update,
    sub,
    zeros_like,
)
from fedtune.algorithms.base import SecureSum
from fedtune.algorithms.fedavg.algorithm import LoraFedAlgorithm
from fedtune.algorithms.registry import register
from fedtune.algorithms.scaffold.config import ScaffoldConfig
from fedtune.core.messages import Broadcast, ClientState, ServerState, Update, prefixed
from fedtune.training.context import ProviderContext, TenantContext
from fedtune.training.local import TrainResult


@register
class Scaffold(LoraFedAlgorithm[ScaffoldConfig]):
    """FedAvg with control variates correcting client drift."""

    update_groups = ("adapter", "control_delta")

    def init_state(self, ctx: ProviderContext) -> ServerState:
        state = super().init_state(ctx)
        control = zeros_like(state.group("adapter"))
        state.tensors.update(prefixed("control", control))
        return state

    def configure_round(
        self, ctx: ProviderContext, state: ServerState, round_index: int
    ) -> Broadcast:
        broadcast = super().configure_round(ctx, state, round_index)
        broadcast.tensors.update(prefixed("control", state.group("control")))
        return broadcast

    @staticmethod
    def _client_control(broadcast: Broadcast, client_state: ClientState | None) -> dict[str, torch.Tensor]:
        if client_state is None:  # first participation: c_i = 0
            return zeros_like(broadcast.group("control"))
        return client_state.group("control")

    def grad_correction(
        self, broadcast: Broadcast, client_state: ClientState | None
    ) -> dict[str, torch.Tensor] | None:
        c = broadcast.group("control")
        return sub(c, self._client_control(broadcast, client_state))

    def finish_client(
        self,
        ctx: TenantContext,
        update: Update,
        trained: dict[str, torch.Tensor],
        broadcast: Broadcast,
        client_state: ClientState | None,
        result: TrainResult,
    ) -> tuple[Update, ClientState | None]:
        c_i = self._client_control(broadcast, client_state)
        c_i_plus = scaffold_new_client_variate(
            c_i,
            broadcast.group("control"),
            broadcast.group("adapter"),
            trained,
            local_steps=result.steps,
            lr=ctx.training.lr,
        )
        update.tensors.update(prefixed("control_delta", sub(c_i_plus, c_i)))
        return update, ClientState(tensors=prefixed("control", c_i_plus), meta={})

    def aggregate(
        self,
        ctx: ProviderContext,
        state: ServerState,
        updates: dict[str, Update],
        round_index: int,
    ) -> ServerState:
        names = sorted(updates)
        x_new, c_new = scaffold_server_update(
            state.group("adapter"),
            state.group("control"),
            [updates[n].group("adapter") for n in names],
            [updates[n].group("control_delta") for n in names],
            n_total_clients=int(ctx.num_tenants),
            global_lr=self.config.global_lr,
            weights=self.client_weights(updates, names),
        )
        tensors = prefixed("adapter", x_new) | prefixed("control", c_new)
        return ServerState(tensors=tensors, meta={"round": round_index})

    # -- secure aggregation: the sums of y_i and of c_i+ - c_i, unweighted (the paper's mean) --
    def sum_weight(self, update: Update) -> float:
        return 1.0

    def aggregate_sum(
        self, ctx: ProviderContext, state: ServerState, summed: SecureSum, round_index: int
    ) -> ServerState:
        """Line 17 from the unmasked means: ``mean(y_i) - x`` and ``mean(c_i+ - c_i)``."""
        x = state.group("adapter")
        mean_y = summed.group("adapter")
        mean_dy = {k: mean_y[k].to(torch.float64) - x_t.to(torch.float64) for k, x_t in x.items()}
        x_new, c_new = scaffold_server_step(
            x,
            state.group("control"),
            mean_dy,
            summed.group("control_delta"),
            n_participants=len(summed.metas),
            n_total_clients=int(ctx.num_tenants),
            global_lr=self.config.global_lr,
        )
        tensors = prefixed("adapter", x_new) | prefixed("control", c_new)
        return ServerState(tensors=tensors, meta={"round": round_index})
