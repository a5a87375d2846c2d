"""The tenant's side: receiving the package, and AdapEmu evaluation (loss, GSM8K exact match)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from fedtune.algorithms.fedbiot.client import evaluate_adapemu, receive
from fedtune.algorithms.fedbiot.config import FedBiOTConfig
from fedtune.algorithms.fedbiot.package import Blueprint, select
from fedtune.algorithms.fedbiot.server import Provider
from fedtune.core.errors import ModelError
from fedtune.core.messages import Broadcast, ClientState
from fedtune.data.formats import Example
from fedtune.training.context import TenantData
from tests.unit.models.helpers import logits, sample_ids

PACKAGE = {"w": torch.ones(2)}


def _broadcast(base: int | None, has_full: bool) -> Broadcast:
    tensors = {"delta/w": torch.full((2,), 0.5)}
    if has_full:
        tensors["full/w"] = torch.full((2,), 7.0)
    return Broadcast(tensors=tensors, meta={"round": 3, "delta_base": base, "has_full": has_full})


def test_a_current_copy_applies_the_delta_and_others_take_the_full_package() -> None:
    kept = ClientState(tensors={"package/w": torch.ones(2)}, meta={"version": 2})
    package, received, how = receive(_broadcast(2, has_full=True), kept)
    assert how == "delta" and torch.equal(package["w"], torch.full((2,), 1.5)) and received == 8
    package, _, how = receive(_broadcast(2, has_full=True), None)
    assert how == "full" and torch.equal(package["w"], torch.full((2,), 7.0))


def test_no_usable_delta_and_no_full_copy_is_a_model_error() -> None:
    kept = ClientState(tensors={"package/w": torch.ones(2)}, meta={"version": 1})
    with pytest.raises(ModelError, match="holds emulator version 1.*delta against version 2") as info:
        receive(_broadcast(2, has_full=False), kept)
    assert "client-state" in info.value.fix


def test_blueprint_from_broadcast_json_rebuilds_the_same_adapemu(
    make_provider: Callable[..., Provider],
) -> None:
    provider = make_provider()
    tenant_side = Blueprint.from_json(provider.blueprint.to_json())
    source = {**provider.base, **provider.initial_adapter()}
    assert torch.equal(
        logits(tenant_side.adapemu(source), sample_ids()),
        logits(provider.blueprint.adapemu(source), sample_ids()),
    )


def _gsm8k(n: int) -> list[Example]:
    return [
        Example(instruction=f"Tom has {i} apples and buys 2. How many?", input="",
                response=f"{i} + 2 = {i + 2}.\nThe answer is {i + 2}")
        for i in range(n)
    ]


@pytest.mark.parametrize(
    ("fields", "scored"),
    [
        ({"gsm8k_shots": 0, "max_new_tokens": 4}, True),
        ({"gsm8k_shots": 8, "max_new_tokens": 4}, False),  # 8 demos exceed 256 positions
        ({"gsm8k_shots": 0, "max_new_tokens": 4, "exact_match": "off"}, False),
    ],
)
def test_gsm8k_exact_match_runs_when_the_data_and_the_prompt_fit(
    make_provider: Callable[..., Provider], fields: dict, scored: bool
) -> None:
    provider = make_provider()
    config = FedBiOTConfig(name="fedbiot", max_generation_examples=2, **fields)
    model = provider.adapemu(select(provider.base, provider.names("emulator")), provider.initial_adapter())
    data = TenantData(tenant="t", train=_gsm8k(2), eval=_gsm8k(3))
    metrics = evaluate_adapemu(provider.ctx, model, data, config)
    assert metrics["adapemu/eval_loss"] > 0
    assert ("adapemu/exact_match" in metrics) is scored
    if scored:
        assert 0.0 <= metrics["adapemu/exact_match"] <= 1.0


def test_non_gsm8k_data_gets_no_exact_match(make_provider: Callable[..., Provider]) -> None:
    provider = make_provider()
    config = FedBiOTConfig(name="fedbiot", gsm8k_shots=0, max_new_tokens=4)
    model = provider.adapemu(select(provider.base, provider.names("emulator")), provider.initial_adapter())
    plain = [Example(instruction="Reverse 'ab'.", input="", response="ba")] * 2
    metrics = evaluate_adapemu(provider.ctx, model, TenantData("t", plain, plain), config)
    assert set(metrics) == {"adapemu/eval_loss"}


def test_lora_targets_outside_the_adapter_layers_are_refused(
    make_provider: Callable[..., Provider],
) -> None:
    from fedtune.config.job import LoraConfig

    provider = make_provider()
    model = provider.blueprint.adapemu(provider.base)
    targets = provider.blueprint.lora_targets(model, LoraConfig())
    # AdapEmu runs base layers [0, 3, 4, 5]: the adapter (4, 5) sits at positions 2 and 3.
    assert len(targets) == 4
    assert all(t.startswith(("model.layers.2.", "model.layers.3.")) for t in targets)
    with pytest.raises(ModelError, match="match no module of the adapter layers"):
        provider.blueprint.lora_targets(model, LoraConfig(target_modules=["no_such_proj"]))
