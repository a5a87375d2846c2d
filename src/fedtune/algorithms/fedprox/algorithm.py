"""FedProx: FedAvg plus a proximal term on the client.

Li et al. 2020, "Federated Optimization in Heterogeneous Networks", Eq. (2): each client
minimises ``h_k(w; w^t) = F_k(w) + (mu/2) ||w - w^t||^2``. The squared norm is the paper's
(Flower's docs once dropped the square). With ``mu = 0`` this is exactly FedAvg (tested).
"""

from __future__ import annotations

import torch

from fedtune.algorithms.fedavg.algorithm import LoraFedAlgorithm
from fedtune.algorithms.fedprox.config import FedProxConfig
from fedtune.algorithms.registry import register
from fedtune.training.local import Regularizer, proximal_term


@register
class FedProx(LoraFedAlgorithm[FedProxConfig]):
    """FedAvg whose clients stay close to the global adapter."""

    def regularizer(self, global_adapter: dict[str, torch.Tensor]) -> Regularizer | None:
        # Applied even at mu = 0 (where it contributes exact zeros), so the FedProx == FedAvg
        # reference test runs the proximal code path rather than skipping it.
        anchor = {k: v.detach().clone() for k, v in global_adapter.items()}
        return proximal_term(anchor, self.config.mu)
