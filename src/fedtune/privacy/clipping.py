"""Per-update L2 clipping (McMahan et al. 2018, Algorithm 1, ``UserUpdate``'s ``clip``).

The whole adapter delta is one vector: ``Delta * min(1, C / ||Delta||_2)``, the norm taken
over every tensor together (flat clipping), so one tenant's contribution to the sum has L2
norm at most C whatever it trained.
"""

from __future__ import annotations

import math

import torch

TensorDict = dict[str, torch.Tensor]


def l2_norm(tensors: TensorDict) -> float:
    """The L2 norm of all tensors as one vector (computed in float64)."""
    return math.sqrt(sum(float(t.detach().double().pow(2).sum()) for t in tensors.values()))


def clip(tensors: TensorDict, bound: float) -> tuple[TensorDict, float]:
    """``tensors`` scaled to L2 norm at most ``bound``; returns them and the norm before.

    Raises:
        ValueError: ``bound`` is not a positive finite number, or a value is not finite.
    """
    if not (math.isfinite(bound) and bound > 0):
        raise ValueError(f"clip bound must be a positive finite number, got {bound!r}")
    norm = l2_norm(tensors)
    if not math.isfinite(norm):
        raise ValueError(f"the update has a non-finite L2 norm ({norm}); it cannot be clipped")
    factor = min(1.0, bound / norm) if norm > 0 else 1.0
    return {k: (v.double() * factor).to(v.dtype) for k, v in tensors.items()}, norm
