"""The two halves of one DP-FedAvg round (McMahan et al. 2018, Algorithm 1), on adapter deltas.

Tenant (``UserUpdate``): ``Delta_k = theta_k - theta_t``, clipped to L2 norm ``C``; with
distributed placement it adds its share ``N(0, z^2 C^2 / m)`` of the noise before upload, so
the ``m`` shares of a round sum to the full ``N(0, z^2 C^2)`` and secure aggregation hides each
share's tenant. The upload is ``theta_t + clipped Delta_k (+ share)``: an adapter of the usual
shape, which every later check and the algorithm's own aggregation take as it is.

Provider: the sum of the clipped deltas (re-clipped when it sees them one by one and the noise
is its own to add, so a tenant that skipped clipping cannot exceed C), plus ``N(0, z^2 C^2)``
under central placement, divided by the *expected* number of contributions ``m`` — the paper's
fixed-denominator estimator ``f~_f`` with unit weights (``w_k = 1``, ``qW = m``). Dividing by
the number that actually arrived would make the denominator depend on who took part.

Weights: unit weights for every tenant. Sample-weighted means give a tenant influence
``n_k / sum n`` that no clip norm bounds (the paper caps weights, ``w_k = min(n_k / w^, 1)``,
for that reason); fedtune requires ``aggregation_weights: uniform`` with DP instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from fedtune.privacy.clipping import clip
from fedtune.privacy.noise import add_gaussian

TensorDict = dict[str, torch.Tensor]


@dataclass(frozen=True)
class RoundPlan:
    """What the provider tells each sampled tenant about a round's privacy (a JSON message)."""

    round: int
    clip_norm: float
    noise_share_std: float  # per coordinate; 0 under central placement
    report_unclipped: bool  # adaptive clipping: say whether the delta fitted under clip_norm

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RoundPlan:
        """Inverse of :meth:`to_json`."""
        return cls(
            round=int(data["round"]),
            clip_norm=float(data["clip_norm"]),
            noise_share_std=float(data["noise_share_std"]),
            report_unclipped=bool(data["report_unclipped"]),
        )


def _delta(trained: TensorDict, reference: TensorDict) -> TensorDict:
    return {k: trained[k].double() - reference[k].double() for k in sorted(reference)}


def privatize(
    trained: TensorDict, reference: TensorDict, plan: RoundPlan, generator: torch.Generator
) -> tuple[TensorDict, bool]:
    """Tenant: the adapter to upload (reference + clipped delta + noise share) and whether
    the delta was within the clip norm."""
    clipped, norm = clip(_delta(trained, reference), plan.clip_norm)
    noised = add_gaussian(clipped, plan.noise_share_std, generator)
    out = {k: (reference[k].double() + noised[k]).to(reference[k].dtype) for k in sorted(reference)}
    return out, norm <= plan.clip_norm


def clipped_sum(adapters: Sequence[TensorDict], reference: TensorDict, clip_norm: float | None) -> TensorDict:
    """Provider: the sum of the deltas of ``adapters`` to ``reference``, each clipped to
    ``clip_norm`` first unless it is None (the uploads carry noise shares, or are a sum)."""
    total = {k: torch.zeros(v.shape, dtype=torch.float64) for k, v in reference.items()}
    for adapter in adapters:
        delta = _delta(adapter, reference)
        if clip_norm is not None:
            delta, _ = clip(delta, clip_norm)
        for k in total:
            total[k] += delta[k]
    return total


def release(total: TensorDict, noise_std: float, expected: int, generator: torch.Generator) -> TensorDict:
    """Provider: ``(sum + N(0, noise_std^2)) / expected`` — the noised mean delta."""
    noised = add_gaussian(total, noise_std, generator)
    return {k: v / expected for k, v in noised.items()}
