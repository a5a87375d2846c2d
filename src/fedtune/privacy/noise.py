"""Gaussian noise drawn from a seed only its drawer knows.

The job's ``seed`` is in the job file every party reads, so noise derived from it could be
regenerated and subtracted. Each draw seeds torch's generator from the operating system's
CSPRNG instead; runs stay reproducible in everything but the noise. (Floating-point Gaussian
samplers are not hardened against Mironov's 2012 attack; neither is Opacus outside its
``secure_mode``.)
"""

from __future__ import annotations

import secrets

import torch

TensorDict = dict[str, torch.Tensor]


def secret_generator() -> torch.Generator:
    """A CPU generator seeded from ``secrets`` (never from the job seed)."""
    return torch.Generator().manual_seed(secrets.randbits(63))


def add_gaussian(tensors: TensorDict, std: float, generator: torch.Generator) -> TensorDict:
    """``tensors`` plus independent N(0, std^2) per coordinate (drawn in float64)."""
    if std == 0:
        return dict(tensors)
    return {
        k: (v.double() + torch.normal(0.0, std, tuple(v.shape), generator=generator, dtype=torch.float64)).to(v.dtype)
        for k, v in sorted(tensors.items())
    }
