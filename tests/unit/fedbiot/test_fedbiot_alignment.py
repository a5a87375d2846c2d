"""Server alignment (Eq. 2): pre-distillation lowers L2 and KL on held-out public data;
with lambda = 0 the KL term (and so the adapter) has no effect on the emulator."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from fedtune.algorithms.fedbiot.package import select
from fedtune.algorithms.fedbiot.server import Provider, initial_state
from fedtune.core.errors import ConfigError
from tests.unit.fedbiot.conftest import tiny_context


def test_pre_distillation_lowers_l2_and_kl_on_held_out_public_data(
    make_provider: Callable[..., Provider],
) -> None:
    provider = make_provider(
        pre_distill_steps=40, align_steps=0, kl_lambda=1.0, align_lr=0.005,
        align_batch_size=8, public_eval_fraction=0.2,
    )
    metrics = initial_state(provider, align_steps=0).meta["metrics"]
    for term in ("l2", "kl"):
        before, after = metrics[f"pre_distill/{term}_before"], metrics[f"pre_distill/{term}_after"]
        assert after < 0.5 * before, (term, before, after)


def _aligned(provider: Provider, adapter: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    emulator = select(provider.base, provider.names("emulator"))
    trained, _ = provider.align(emulator, adapter, steps=3, tag="test")
    return trained


@pytest.mark.parametrize("kl_lambda", [0.0, 1.0])
def test_adapter_moves_the_emulator_only_through_the_kl_term(
    make_provider: Callable[..., Provider], kl_lambda: float
) -> None:
    provider = make_provider(kl_lambda=kl_lambda, align_lr=0.005)
    adapter = provider.initial_adapter()
    other = {k: v + 0.3 * torch.randn(v.shape, generator=torch.Generator().manual_seed(1))
             for k, v in adapter.items()}
    a, b = _aligned(provider, adapter), _aligned(provider, other)
    emulator = select(provider.base, provider.names("emulator"))
    assert any(not torch.equal(a[k], emulator[k]) for k in a)  # alignment did train
    same = all(torch.equal(a[k], b[k]) for k in a)
    assert same is (kl_lambda == 0.0)


def test_alignment_trains_only_emulator_layers(make_provider: Callable[..., Provider]) -> None:
    provider = make_provider(align_lr=0.005)
    trained = _aligned(provider, provider.initial_adapter())
    assert set(trained) == set(provider.names("emulator"))
    assert not set(trained) & set(provider.names("dropped"))


def test_missing_public_data_names_the_field(
    make_provider: Callable[..., Provider], tmp_path: object
) -> None:
    unset = make_provider(ctx=tiny_context(), pre_distill_steps=1)
    unset.ctx.public_data_uri = None
    with pytest.raises(ConfigError, match="public_data_uri is not set"):
        initial_state(unset, 0)
    missing = make_provider(ctx=tiny_context(), pre_distill_steps=1)
    missing.ctx.public_data_uri = f"{tmp_path}/no-such.jsonl"
    with pytest.raises(ConfigError, match="public_data_uri=.*no-such.jsonl.*cannot be read"):
        initial_state(missing, 0)


def test_a_bf16_emulator_is_aligned_and_stored_in_bf16(
    make_provider: Callable[..., Provider], tmp_path: object
) -> None:
    from pathlib import Path

    from fedtune.algorithms.fedbiot import transport
    from fedtune.core.messages import ServerState
    from fedtune.storage import open_store

    provider = make_provider(pre_distill_steps=2, align_steps=0, align_lr=0.005)
    provider.base = {k: v.to(torch.bfloat16) for k, v in provider.base.items()}  # a bf16 model
    state = initial_state(provider, align_steps=0)
    emulator = state.group("emulator")
    before = select(provider.base, provider.names("emulator"))
    assert emulator and all(t.dtype == torch.bfloat16 for t in emulator.values())
    assert any(not torch.equal(emulator[k], before[k]) for k in emulator)  # it did train
    view, _ = transport.next_view(emulator, None, torch.bfloat16)  # the tenants' copy
    assert all(t.dtype == torch.bfloat16 for t in view.values())
    store = open_store(str(Path(str(tmp_path)) / "store"))
    state.save(store, "state/round-000000")
    stored = ServerState.load(store, "state/round-000000").group("emulator")
    assert all(t.dtype == torch.bfloat16 for t in stored.values())
