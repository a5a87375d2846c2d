"""An update's tensors as one float64 vector, in the sorted key order both sides derive
from the broadcast, and back."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from fedtune.aggregation import TensorSpec


def flatten(tensors: Mapping[str, torch.Tensor], specs: Mapping[str, TensorSpec]) -> np.ndarray:
    """Concatenate ``tensors`` (keys and shapes as ``specs``) into a float64 vector."""
    if not specs:
        return np.zeros(0, dtype=np.float64)
    return np.concatenate(
        [tensors[k].detach().to(torch.float64).reshape(-1).cpu().numpy() for k in sorted(specs)]
    )


def unflatten(vector: np.ndarray, specs: Mapping[str, TensorSpec]) -> dict[str, torch.Tensor]:
    """Split a vector from :func:`flatten` back into tensors of the specs' shapes and dtypes."""
    out: dict[str, torch.Tensor] = {}
    offset = 0
    for key in sorted(specs):
        spec = specs[key]
        size = int(np.prod(spec.shape)) if spec.shape else 1
        chunk = torch.from_numpy(np.array(vector[offset : offset + size], dtype=np.float64))
        out[key] = chunk.reshape(spec.shape).to(spec.dtype)
        offset += size
    return out


def length(specs: Mapping[str, TensorSpec]) -> int:
    """Elements of a flattened update."""
    return sum(int(np.prod(s.shape)) if s.shape else 1 for s in specs.values())
