"""Arithmetic on state dicts and the sample-weighted mean of FedAvg.

A *state dict* here is ``dict[str, torch.Tensor]`` keyed by parameter name (for FedIT on LoRA:
the adapter's ``lora_A`` / ``lora_B`` tensors). Everything in this module is a pure function:
inputs are never modified, results are new tensors.

FedAvg (McMahan et al. 2017, "Communication-Efficient Learning of Deep Networks from
Decentralized Data", Algorithm 1): ``w = sum_k (n_k / n) * w_k`` with ``n = sum_k n_k``. On LoRA
the ``A`` and ``B`` factors are averaged separately, as every reference implementation does
(this is not the average of ``B @ A``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fedtune.core.errors import QuorumError, UpdateRejected

TensorDict = dict[str, torch.Tensor]
"""Tensors keyed by parameter name."""

_ACCUMULATOR = torch.float64  # accumulate in float64 so that bf16/fp16 inputs lose nothing


def _label(index: int, names: Sequence[str] | None) -> str:
    if names is not None and index < len(names):
        return names[index]
    return f"update {index}"


def _tenant_labels(names: Sequence[str] | None) -> list[str] | None:
    return None if names is None else [f"the update of tenant {n!r}" for n in names]


def check_same_layout(
    states: Sequence[TensorDict],
    *,
    names: Sequence[str] | None = None,
    check_dtype: bool = True,
) -> None:
    """Raise unless every state dict has the keys, shapes (and dtypes) of the first.

    Args:
        states: State dicts to compare; the first is the reference.
        names: Optional labels of the states, used in error messages.
        check_dtype: Also require equal dtypes.

    Raises:
        UpdateRejected: A key is missing or extra, or a shape or dtype differs.
    """
    if not states:
        return
    ref = states[0]
    for i, state in enumerate(states[1:], start=1):
        missing = sorted(set(ref) - set(state))
        extra = sorted(set(state) - set(ref))
        if missing or extra:
            raise UpdateRejected(
                f"{_label(i, names)} does not have the keys of {_label(0, names)}: "
                f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                f"unexpected {extra[:5]}{'...' if len(extra) > 5 else ''}",
                fix="All updates of a round must hold the same parameters; check that every "
                "tenant trains the same adapter configuration.",
            )
        for key, tensor in ref.items():
            other = state[key]
            if tuple(other.shape) != tuple(tensor.shape):
                raise UpdateRejected(
                    f"{_label(i, names)} has shape {tuple(other.shape)} for {key!r}, "
                    f"expected {tuple(tensor.shape)} as in {_label(0, names)}",
                    fix="All updates of a round must have the same shapes; check the tenants' "
                    "LoRA rank and target modules.",
                )
            if check_dtype and other.dtype != tensor.dtype:
                raise UpdateRejected(
                    f"{_label(i, names)} has dtype {other.dtype} for {key!r}, expected "
                    f"{tensor.dtype} as in {_label(0, names)}",
                    fix="Send updates in one dtype (the dtype of the broadcast adapter).",
                )


def weighted_mean(
    states: Sequence[TensorDict],
    weights: Sequence[float],
    *,
    names: Sequence[str] | None = None,
) -> TensorDict:
    """Sample-count weighted mean per key (FedAvg, McMahan et al. 2017, Algorithm 1).

    ``out[k] = sum_i w_i * states[i][k] / sum_i w_i``, accumulated in float64 and returned
    in the inputs' dtype. A single state is returned unchanged (bitwise, as fresh tensors).

    Args:
        states: State dicts with identical keys, shapes and dtypes.
        weights: One non-negative weight per state (usually the sample count).
        names: Optional tenant names for error messages.

    Returns:
        The weighted mean as a new state dict.

    Raises:
        QuorumError: ``states`` is empty.
        UpdateRejected: Lengths, keys, shapes or dtypes differ, a weight is negative or not
            finite, or the weights sum to zero.
    """
    if not states:
        raise QuorumError(
            "no updates to aggregate (got 0 state dicts)",
            fix="At least one tenant must deliver a valid update before aggregation.",
        )
    if len(weights) != len(states):
        raise UpdateRejected(
            f"got {len(states)} updates but {len(weights)} weights",
            fix="Pass exactly one sample count per update.",
        )
    labels = _tenant_labels(names)
    for i, w in enumerate(weights):
        if not math.isfinite(float(w)) or float(w) < 0:
            raise UpdateRejected(
                f"{_label(i, labels)} has weight {w!r}; weights must be finite and >= 0",
                fix="Report the number of training samples the update was computed on.",
            )
    total = math.fsum(float(w) for w in weights)
    if total <= 0:
        raise UpdateRejected(
            f"the weights {list(weights)!r} sum to {total}; the total must be positive",
            fix="At least one update must report a positive sample count.",
        )
    check_same_layout(states, names=_tenant_labels(names))
    if len(states) == 1:
        return {k: v.detach().clone() for k, v in states[0].items()}
    out: TensorDict = {}
    for key, first in states[0].items():
        acc = torch.zeros(first.shape, dtype=_ACCUMULATOR)
        for state, w in zip(states, weights, strict=True):
            acc.add_(state[key].detach().to(device="cpu", dtype=_ACCUMULATOR), alpha=float(w))
        out[key] = (acc / total).to(dtype=first.dtype, device=first.device)
    return out


def add(a: TensorDict, b: TensorDict) -> TensorDict:
    """``a + b`` per key; the result has ``a``'s dtypes."""
    check_same_layout([a, b], names=("the left operand", "the right operand"), check_dtype=False)
    return {k: (a[k] + b[k].to(a[k].dtype)) for k in a}


def sub(a: TensorDict, b: TensorDict) -> TensorDict:
    """``a - b`` per key; the result has ``a``'s dtypes."""
    check_same_layout([a, b], names=("the left operand", "the right operand"), check_dtype=False)
    return {k: (a[k] - b[k].to(a[k].dtype)) for k in a}


def scale(a: TensorDict, factor: float) -> TensorDict:
    """``factor * a`` per key."""
    return {k: v * factor for k, v in a.items()}


def zeros_like(a: TensorDict, dtype: torch.dtype | None = None) -> TensorDict:
    """A state dict of zeros with ``a``'s keys and shapes (and dtypes unless given)."""
    return {k: torch.zeros_like(v, dtype=dtype or v.dtype) for k, v in a.items()}


def deltas(states: Sequence[TensorDict], reference: TensorDict) -> list[TensorDict]:
    """``state_i - reference`` for each state (the client updates ``y_i - x`` of FedOPT)."""
    return [sub(state, reference) for state in states]
