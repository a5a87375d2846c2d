"""Sending the emulator every round as a delta against the tenants' copy (optionally bf16).

The provider realigns the emulator each round, so it must go out again each round (the
reference implementation never re-sent it). What crosses is ``d = cast(E - V)``, where ``V``
is the copy tenants hold: the *view*. Both sides then compute ``V' = V + float(d)`` with the
same float32 operations, so the provider knows the tenants' copy bit for bit and bf16
rounding never accumulates (each delta corrects the previous rounding). Tensors whose delta
is exactly zero are left out: frozen embeddings and head after round 1, and the whole
emulator when it is not realigned (FedOT, Offsite-tuning).

Who holds what: the provider's state records, per tenant, the view version its last accepted
update was trained on. A tenant at the latest version applies the delta; any other (new,
skipped rounds, or an update that was rejected) takes the full copy, which the broadcast then
also carries. Each tenant reports the bytes it needed (``bytes_down``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from fedtune.core.errors import ModelError

Tensors = dict[str, torch.Tensor]

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def next_view(
    emulator: Mapping[str, torch.Tensor],
    view: Mapping[str, torch.Tensor] | None,
    dtype: torch.dtype,
) -> tuple[Tensors, Tensors]:
    """The tenants' next copy of the emulator and the delta that produces it.

    Without a previous view the new view is an exact copy (sent in full) and the delta empty.
    """
    if view is None:
        return {k: v.detach().clone().contiguous() for k, v in emulator.items()}, {}
    if set(view) != set(emulator):
        raise ModelError(
            f"the stored emulator view has {len(view)} tensors, the emulator {len(emulator)}",
            fix="The server state is inconsistent; restart the job with --fresh.",
        )
    new_view: Tensors = {}
    delta: Tensors = {}
    for name, value in emulator.items():
        step = (value.detach() - view[name]).to(dtype)
        if not torch.any(step):
            new_view[name] = view[name].clone()
            continue
        delta[name] = step.contiguous()
        new_view[name] = view[name] + step.to(view[name].dtype)
    return new_view, delta


def apply_delta(view: Mapping[str, torch.Tensor], delta: Mapping[str, torch.Tensor]) -> Tensors:
    """The tenant's side of :func:`next_view`: ``V + float(d)``, tensors without delta kept.

    Raises:
        ModelError: The delta names a tensor the tenant's copy lacks, or a shape differs.
    """
    unknown = sorted(set(delta) - set(view))
    wrong = [n for n in delta if n in view and delta[n].shape != view[n].shape]
    if unknown or wrong:
        raise ModelError(
            f"the emulator delta does not fit the tenant's copy: unknown {unknown[:4]}, "
            f"wrong shape {wrong[:4]}",
            fix="Delete the tenant's client-state/ folder so the provider sends the full "
            "emulator, then resume.",
        )
    return {
        name: (value + delta[name].to(value.dtype)) if name in delta else value.clone()
        for name, value in view.items()
    }


def needs_full(holders: Mapping[str, int], latest: int | None, num_tenants: int) -> bool:
    """Whether any tenant may lack the latest view (then the full copy is broadcast too)."""
    if latest is None:
        return True
    current = sum(1 for version in holders.values() if version == latest)
    return current < num_tenants


def nbytes(tensors: Mapping[str, torch.Tensor]) -> int:
    """Raw bytes of tensors."""
    return sum(t.numel() * t.element_size() for t in tensors.values())


def compare_encodings(
    view: Mapping[str, torch.Tensor], emulator: Mapping[str, torch.Tensor]
) -> dict[str, float]:
    """Bytes to bring tenants from ``view`` to ``emulator``: full copy, fp32 and bf16 delta.

    Also the largest absolute difference between the bf16-delta result and the emulator
    (the fp32 delta's is at float32 rounding level). For the broadcast benchmark.
    """
    _, fp32 = next_view(emulator, view, torch.float32)
    bf16_view, bf16 = next_view(emulator, view, torch.bfloat16)
    error = max(
        (float((bf16_view[k] - emulator[k]).abs().max()) for k in emulator if emulator[k].numel()),
        default=0.0,
    )
    return {
        "full_bytes": float(nbytes(emulator)),
        "delta_float32_bytes": float(nbytes(fp32)),
        "delta_bfloat16_bytes": float(nbytes(bf16)),
        "bfloat16_max_abs_error": error,
    }


def round_encodings(
    states: Sequence[tuple[Mapping[str, torch.Tensor], Mapping[str, torch.Tensor]]],
) -> list[dict[str, float]]:
    """Per round, the emulator bytes of a full copy, an fp32 delta and a bf16 delta.

    Args:
        states: ``(emulator, view)`` of the server states 0..R-1 of a run (state r-1 is what
            round r's broadcast is computed from; state 0 has no view).

    Returns:
        One row per round 1..R; round 1 sends the full copy whatever the encoding.
    """
    rows = []
    for index, (emulator, view) in enumerate(states, start=1):
        if not view:
            full = float(nbytes(emulator))
            rows.append(
                {
                    "round": float(index),
                    "full_bytes": full,
                    "delta_float32_bytes": full,
                    "delta_bfloat16_bytes": full,
                    "bfloat16_max_abs_error": 0.0,
                }
            )
            continue
        rows.append({"round": float(index), **compare_encodings(view, emulator)})
    return rows
