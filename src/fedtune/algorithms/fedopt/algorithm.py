"""FedOPT: a server optimizer applied to the mean client delta (FedAdagrad, FedAdam, FedYogi).

Reddi et al. 2021, "Adaptive Federated Optimization", Algorithm 2:
``Delta_t = 1/|S| sum_i (y_i - x_t)``; ``m_t = b1 m_{t-1} + (1-b1) Delta_t``; then
Adagrad ``v_t = v_{t-1} + Delta_t^2``, Adam ``v_t = b2 v_{t-1} + (1-b2) Delta_t^2``, Yogi
``v_t = v_{t-1} - (1-b2) Delta_t^2 sign(v_{t-1} - Delta_t^2)``; ``x_{t+1} = x_t + eta m_t /
(sqrt(v_t) + tau)``. No bias correction (the paper has none), ``v_{-1} = tau^2``. The mean of
the deltas is uniform by default, as in Algorithm 2; ``aggregation_weights: samples`` weights
it by sample counts as FedAvg does (OpenFedLLM's squared momentum is not repeated).
``server_optimizer: sgd`` gives ``x + eta m_t``: with eta=1, beta1=0 that is FedAvg with the
same weights (tested).
"""

from __future__ import annotations

from fedtune.aggregation import (
    ServerOptConfig,
    deltas,
    server_opt_init,
    server_opt_step,
    weighted_mean,
)
from fedtune.algorithms.fedavg.algorithm import LoraFedAlgorithm
from fedtune.algorithms.fedopt.config import FedOptConfig
from fedtune.algorithms.registry import register
from fedtune.core.messages import ServerState, Update, prefixed
from fedtune.training.context import ProviderContext


@register
class FedOpt(LoraFedAlgorithm[FedOptConfig]):
    """FedAvg's clients with an adaptive optimizer on the server."""

    def _server_opt(self) -> ServerOptConfig:
        c = self.config
        return ServerOptConfig(kind=c.optimizer, eta=c.eta, beta1=c.beta1, beta2=c.beta2, tau=c.tau)

    def init_state(self, ctx: ProviderContext) -> ServerState:
        state = super().init_state(ctx)
        m, v = server_opt_init(state.group("adapter"), self._server_opt())
        state.tensors.update(prefixed("m", m) | prefixed("v", v))
        return state

    def aggregate(
        self,
        ctx: ProviderContext,
        state: ServerState,
        updates: dict[str, Update],
        round_index: int,
    ) -> ServerState:
        names = sorted(updates)
        x = state.group("adapter")
        delta = weighted_mean(
            deltas([updates[n].group("adapter") for n in names], x),
            self.client_weights(updates, names),
            names=names,
        )
        x_new, m, v = server_opt_step(x, delta, state.group("m"), state.group("v"), self._server_opt())
        tensors = prefixed("adapter", x_new) | prefixed("m", m) | prefixed("v", v)
        return ServerState(tensors=tensors, meta={"round": round_index})
