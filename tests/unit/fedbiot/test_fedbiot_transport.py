"""Emulator deltas: exact reconstruction, bf16 without drift, zero deltas left out."""

from __future__ import annotations

import pytest
import torch

from fedtune.algorithms.fedbiot import transport
from fedtune.core.errors import ModelError

G = torch.Generator().manual_seed(11)


def _emulator() -> dict[str, torch.Tensor]:
    return {"a": torch.randn(16, 8, generator=G), "b": torch.randn(8, generator=G)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tenant_copy_equals_provider_view_bitwise(dtype: torch.dtype) -> None:
    emulator = _emulator()
    view, delta = transport.next_view(emulator, None, dtype)
    assert delta == {} and all(torch.equal(view[k], emulator[k]) for k in emulator)
    tenant = {k: v.clone() for k, v in view.items()}
    for _ in range(5):
        emulator = {k: v + 0.01 * torch.randn(v.shape, generator=G) for k, v in emulator.items()}
        view, delta = transport.next_view(emulator, view, dtype)
        tenant = transport.apply_delta(tenant, delta)
        assert all(torch.equal(tenant[k], view[k]) for k in view)
        assert all(d.dtype == dtype for d in delta.values())


def test_bf16_rounding_does_not_accumulate() -> None:
    emulator = _emulator()
    view, _ = transport.next_view(emulator, None, torch.bfloat16)
    naive = {k: v.clone() for k, v in view.items()}  # adds bf16(E_t - E_{t-1}) blindly
    for _ in range(200):
        moved = {k: v + 0.05 * torch.randn(v.shape, generator=G) for k, v in emulator.items()}
        naive = {
            k: value + (moved[k] - emulator[k]).to(torch.bfloat16).float() for k, value in naive.items()
        }
        emulator = moved
        view, delta = transport.next_view(emulator, view, torch.bfloat16)
    ours = max(float((view[k] - emulator[k]).abs().max()) for k in emulator)
    drift = max(float((naive[k] - emulator[k]).abs().max()) for k in emulator)
    # One bf16 rounding of the last delta (8 significant bits) bounds our error...
    assert ours <= max(float(d.float().abs().max()) for d in delta.values()) * 2**-8
    # ...while error-blind deltas random-walk away from the emulator.
    assert drift > 3 * ours


def test_unchanged_tensors_are_left_out_and_bf16_halves_the_bytes() -> None:
    emulator = _emulator()
    view, _ = transport.next_view(emulator, None, torch.float32)
    moved = {"a": emulator["a"] + 1.0, "b": emulator["b"]}
    _, delta32 = transport.next_view(moved, view, torch.float32)
    _, delta16 = transport.next_view(moved, view, torch.bfloat16)
    assert set(delta32) == {"a"}
    assert transport.nbytes(delta16) * 2 == transport.nbytes(delta32)
    sizes = transport.compare_encodings(view, moved)
    assert sizes["full_bytes"] == transport.nbytes(moved)
    assert sizes["delta_float32_bytes"] == transport.nbytes(delta32)
    assert sizes["delta_bfloat16_bytes"] == transport.nbytes(delta16)
    assert sizes["bfloat16_max_abs_error"] < 1e-2


def test_a_delta_that_does_not_fit_the_copy_is_refused() -> None:
    with pytest.raises(ModelError, match="unknown"):
        transport.apply_delta({"a": torch.zeros(2)}, {"z": torch.zeros(2)})
    with pytest.raises(ModelError, match="wrong shape"):
        transport.apply_delta({"a": torch.zeros(2)}, {"a": torch.zeros(3)})


def test_full_copy_is_needed_until_every_tenant_holds_the_latest_view() -> None:
    assert transport.needs_full({}, None, 3)
    assert transport.needs_full({"a": 2, "b": 2}, 2, 3)  # c never reported
    assert transport.needs_full({"a": 2, "b": 1, "c": 2}, 2, 3)  # b skipped a round
    assert not transport.needs_full({"a": 2, "b": 2, "c": 2}, 2, 3)


def test_a_view_that_does_not_match_the_emulator_is_refused() -> None:
    with pytest.raises(ModelError, match="server state is inconsistent|has 1 tensors"):
        transport.next_view(_emulator(), {"a": torch.zeros(16, 8)}, torch.float32)
