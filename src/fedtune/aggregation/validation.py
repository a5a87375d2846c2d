"""Checks every tenant update passes before it may enter aggregation.

An update crosses a trust boundary: a buggy or hostile client step can send missing or extra
tensors, wrong shapes (a different LoRA rank), integer tensors, NaN/Inf after a diverged local
run, or something far larger than the adapter. All problems of one update are collected and
reported at once, naming the tenant, so the engine can leave that update out and go on with
the quorum.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fedtune.core.errors import UpdateRejected

if TYPE_CHECKING:
    from fedtune.config.job import LimitsConfig

_MAX_LISTED = 5  # keep messages readable when an update is entirely wrong


def _listing(keys: list[str]) -> str:
    shown = ", ".join(repr(k) for k in keys[:_MAX_LISTED])
    more = len(keys) - _MAX_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


@dataclass(frozen=True)
class TensorSpec:
    """What one update tensor must look like: the broadcast tensor's shape and dtype."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def update_nbytes(tensors: Mapping[str, torch.Tensor]) -> int:
    """Payload size of a state dict in bytes (elements times element size)."""
    return sum(t.numel() * t.element_size() for t in tensors.values())


def validate_update(
    tenant: str,
    tensors: Mapping[str, object],
    expected: Mapping[str, TensorSpec | tuple[int, ...]],
    max_bytes: int,
) -> None:
    """Reject an update whose keys, shapes, dtypes, values or size are not acceptable.

    Args:
        tenant: The tenant that sent the update (named in the error).
        tensors: The update, parameter name to tensor.
        expected: Parameter name to expected spec (shape and dtype, from the broadcast), or
            to a bare shape when any floating dtype is acceptable.
        max_bytes: Upper bound on the total tensor payload in bytes.

    Raises:
        UpdateRejected: One message listing every problem found: missing keys, unexpected
            keys, wrong shapes (expected vs got), values that are not tensors, non-floating
            dtypes, dtypes other than the broadcast's (a bf16 update of an fp32 adapter), NaN/Inf counts per tensor, and the total size when over ``max_bytes``.
    """
    problems: list[str] = []
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing:
        problems.append(f"missing keys {_listing(missing)}")
    if unexpected:
        problems.append(f"unexpected keys {_listing(unexpected)}")

    real: dict[str, torch.Tensor] = {}
    for key in sorted(tensors):
        value = tensors[key]
        if not isinstance(value, torch.Tensor):
            problems.append(f"{key!r} is a {type(value).__name__}, not a tensor")
            continue
        real[key] = value
        spec = expected.get(key)
        shape = spec.shape if isinstance(spec, TensorSpec) else spec
        if shape is not None and tuple(value.shape) != tuple(shape):
            problems.append(f"{key!r} has shape {tuple(value.shape)}, expected {tuple(shape)}")
        if not value.is_floating_point():
            problems.append(f"{key!r} has non-floating dtype {value.dtype}")
            continue
        if isinstance(spec, TensorSpec) and value.dtype != spec.dtype:
            problems.append(f"{key!r} has dtype {value.dtype}, expected {spec.dtype}")
            continue
        n_nan = int(torch.isnan(value).sum())
        n_inf = int(torch.isinf(value).sum())
        if n_nan or n_inf:
            problems.append(
                f"{key!r} has non-finite values ({n_nan} NaN, {n_inf} Inf of {value.numel()})"
            )

    total = update_nbytes(real)
    if total > max_bytes:
        problems.append(f"total size {total} bytes exceeds the bound of {max_bytes} bytes")

    if problems:
        raise UpdateRejected(
            f"update of tenant {tenant!r} rejected: " + "; ".join(problems),
            fix=f"Inspect tenant {tenant!r}'s client step (same adapter config as the "
            "broadcast, a stable learning rate); the update was left out of aggregation.",
        )


def tensors_norm(tensors: Mapping[str, torch.Tensor]) -> float:
    """The L2 norm of all floating tensors of a message taken as one vector (float64, so a
    1e30 entry squares without overflow): the scale the default update bound is relative to.

    Why ``limits.max_update_norm_ratio`` defaults to 1000 (times this norm of the broadcast,
    at least 1.0): an honest round moves an adapter by a small part of its norm (each weight
    by at most about lr x steps under Adam, while LoRA's A starts at its full init norm);
    SCAFFOLD's control deltas are gradient-sized; DP noise is a few times the clip norm per
    coordinate at most. Measured over every algorithm's tiny test jobs (plain, DP-FedAvg,
    DP-SGD, secure aggregation): the largest ratio was 9 (SCAFFOLD's control deltas with
    AdamW), all others at most 1.2. For a 7B LoRA (r=16, init norm about 35) the estimate is
    about 4x for 100 Adam steps at lr 2e-4, and about 550x for distributed DP noise at noise
    multiplier 5, clip norm 1 and two tenants (the largest honest case found). A swamping outlier (1e30, or a million times
    the broadcast) is far above it, so the default rejects what no honest step sends; a job
    that expects larger steps sets the ratio higher or null.
    """
    squares = 0.0
    for value in tensors.values():
        if value.is_floating_point():
            squares += float(torch.linalg.vector_norm(value, dtype=torch.float64)) ** 2
    return math.sqrt(squares)


def check_update_norm(
    tenant: str,
    tensors: Mapping[str, torch.Tensor],
    reference: Mapping[str, torch.Tensor],
    bound: float | None,
    *,
    setting: str | None = None,
) -> float:
    """The L2 norm of an update's change (its tensors minus the same-named, same-shaped
    ``reference`` tensors, the broadcast; other tensors count whole); reject it above ``bound``.

    Under secure aggregation the provider sees only the sum, so the tenant runs this check
    before masking and the provider runs it on the unmasked mean (a mean of updates within the
    bound stays within it).

    ``setting`` names where ``bound`` came from in the message (default: the absolute
    ``limits.max_update_norm``; :meth:`fedtune.config.job.LimitsConfig.update_norm_bound`
    gives both).

    Raises:
        UpdateRejected: The norm is not finite or exceeds ``bound`` (naming both).
    """
    squares = 0.0
    for key, value in tensors.items():
        delta = value.to(torch.float64)
        # Same name, other shape: a different quantity (e.g. FedMKT's knowledge of another
        # vocabulary), not a value this update changed.
        if key in reference and reference[key].shape == value.shape:
            delta = delta - reference[key].to(torch.float64)
        squares += float(delta.pow(2).sum())
    norm = math.sqrt(squares)
    if bound is not None and not norm <= bound:
        raise UpdateRejected(
            f"update of tenant {tenant!r} rejected: its L2 norm of change {norm:.6g} exceeds "
            + (setting or f"limits.max_update_norm={bound:g}"),
            fix=f"Inspect tenant {tenant!r}'s local training (learning rate, steps), or raise "
            "limits.max_update_norm (or limits.max_update_norm_ratio) if such updates are "
            "expected.",
        )
    return norm


def check_update_bound(
    tenant: str,
    tensors: Mapping[str, torch.Tensor],
    reference: Mapping[str, torch.Tensor],
    limits: LimitsConfig,
    *,
    relative: bool = True,
) -> float | None:
    """:func:`check_update_norm` under the job's bound (absolute ``limits.max_update_norm``,
    else ``limits.max_update_norm_ratio`` times the norm of ``reference``, the broadcast);
    the norm, or None when there is no bound. ``relative=False`` where the update is no change
    of the broadcast (an algorithm without ``summed_update``: FedMKT's knowledge).

    Raises:
        UpdateRejected: Over the bound, naming the norm, the bound and its setting.
    """
    bound = limits.update_norm_bound(tensors_norm(reference), relative=relative)
    if bound is None:
        return None
    return check_update_norm(tenant, tensors, reference, bound[0], setting=bound[1])
