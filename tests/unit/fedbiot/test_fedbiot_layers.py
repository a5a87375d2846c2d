"""Layer extraction (FedBiOT Algorithm 2, Offsite-tuning split) and composites mapped by name."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from fedtune.core.errors import ConfigError, ModelError
from fedtune.models.layers import (
    build_composite,
    layer_extract,
    load_by_name,
    locate_layers,
    map_to_base,
    map_to_composite,
    offsite_split,
    unique_state,
)
from tests.unit.models.helpers import logits, sample_ids, tiny

# Algorithm 2 by hand: floor(j * 29 / 23) and floor(j * 27 / 21).
PAPER_S2 = [0, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 13, 15, 16, 17, 18, 20, 21, 22, 23, 25, 26, 27, 29]
PAPER_S4 = [0, 1, 2, 3, 5, 6, 7, 9, 10, 11, 12, 14, 15, 16, 18, 19, 20, 21, 23, 24, 25, 27]


def test_llama7b_s2_dropout_02_gives_24_of_30() -> None:
    split = layer_extract(32, adapter_size=2, dropout=0.2)
    assert split.full_emulator == tuple(range(30))
    assert split.adapter == (30, 31)
    assert len(split.emulator) == 24
    assert list(split.emulator) == PAPER_S2
    assert split.dropped == (4, 9, 14, 19, 24, 28)


def test_llama7b_s4_dropout_02_gives_22_of_28() -> None:
    split = layer_extract(32, adapter_size=4, dropout=0.2)
    assert split.full_emulator == tuple(range(28))
    assert split.adapter == (28, 29, 30, 31)
    assert list(split.emulator) == PAPER_S4
    assert split.emulator[0] == 0 and split.emulator[-1] == 27  # first and last of E* kept


@pytest.mark.parametrize(
    ("n", "s", "dropout", "kept"),
    [(32, 2, 0.5, 15), (8, 2, 0.5, 3), (8, 2, 0.0, 6), (5, 1, 0.7, 1), (10, 3, 0.3, 4)],
)
def test_emulator_size_is_floor_beta_times_rest(n: int, s: int, dropout: float, kept: int) -> None:
    split = layer_extract(n, s, dropout)
    assert len(split.emulator) == kept
    assert len(set(split.emulator)) == kept and set(split.emulator) <= set(split.full_emulator)
    assert split.emulator[0] == 0


def test_offsite_split_is_first2_last2() -> None:
    split = offsite_split(12, dropout=0.5)
    assert split.adapter == (0, 1, 10, 11)
    assert split.full_emulator == tuple(range(2, 10))
    assert split.emulator == (2, 4, 6, 9)  # 2 + floor(j * 7 / 3)
    assert split.emulator_order == (0, 1, 2, 4, 6, 9, 10, 11)


def test_split_round_trips_through_json() -> None:
    split = layer_extract(16, 2, 0.5)
    assert type(split).from_json(split.to_json()) == split


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_layers": 4, "adapter_size": 4, "dropout": 0.2}, "adapter_size"),
        ({"num_layers": 4, "adapter_size": 6, "dropout": 0.2}, "adapter_size"),
        ({"num_layers": 4, "adapter_size": 0, "dropout": 0.2}, "adapter_size"),
        ({"num_layers": 8, "adapter_size": 2, "dropout": 1.0}, "dropout"),
        ({"num_layers": 8, "adapter_size": 2, "dropout": -0.1}, "dropout"),
        ({"num_layers": 3, "adapter_size": 2, "dropout": 0.5}, "dropout"),  # floor(0.5) = 0
    ],
)
def test_bad_split_inputs_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=f"algorithm.{field}"):
        layer_extract(**kwargs)


def test_offsite_split_needs_a_middle_layer() -> None:
    with pytest.raises(ConfigError, match="model.num_layers=4"):
        offsite_split(4, 0.2)


@pytest.mark.parametrize(("arch", "prefix"), [("llama", "model.layers"), ("gpt2", "transformer.h")])
def test_layers_are_located_for_llama_and_gpt2(arch: str, prefix: str) -> None:
    layout = locate_layers(tiny(arch, num_layers=3))
    assert (layout.prefix, layout.num_layers) == (prefix, 3)
    assert layout.parse(f"{prefix}.2.mlp.x.weight") == (2, "mlp.x.weight")
    assert layout.parse("lm_head.weight") is None


class _NoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = LlamaConfig(num_hidden_layers=3)
        self.blocks = nn.Sequential(nn.Linear(2, 2))


def test_unlocatable_layers_are_a_model_error() -> None:
    with pytest.raises(ModelError, match="cannot locate the decoder layers") as info:
        locate_layers(_NoLayers())
    assert "model" in info.value.fix


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_full_composite_of_base_tensors_reproduces_the_base(arch: str) -> None:
    base = tiny(arch, num_layers=4)
    layout = locate_layers(base)
    same = build_composite(base.config, layout, range(4), unique_state(base), what="AdapFu")
    assert torch.equal(logits(same, sample_ids()), logits(base, sample_ids()))


def test_composite_takes_each_layer_by_its_base_name() -> None:
    base = tiny("llama", num_layers=5)
    layout = locate_layers(base)
    order = [0, 3, 4]
    model = build_composite(base.config, layout, order, unique_state(base), what="AdapEmu")
    assert model.config.num_hidden_layers == 3
    for k, index in enumerate(order):
        assert torch.equal(
            model.model.layers[k].mlp.down_proj.weight, base.model.layers[index].mlp.down_proj.weight
        )
    back = map_to_base(layout, order, unique_state(model))
    assert set(back) == set(map_to_base(layout, order, map_to_composite(layout, order, unique_state(base))))


def test_gpt2_tied_head_is_one_tensor_and_stays_tied() -> None:
    base = tiny("gpt2", num_layers=2)
    state = unique_state(base)
    assert "transformer.wte.weight" in state and "lm_head.weight" not in state
    model = build_composite(base.config, locate_layers(base), [1], state, what="AdapEmu")
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()


def test_missing_or_unexpected_names_are_refused() -> None:
    base = tiny("llama", num_layers=3)
    layout = locate_layers(base)
    state = unique_state(base)
    partial = {k: v for k, v in state.items() if k != "model.norm.weight"}
    with pytest.raises(ModelError, match=r"1 missing: model\.norm\.weight"):
        build_composite(base.config, layout, [0, 2], partial, what="AdapEmu")
    model = LlamaForCausalLM(base.config)
    with pytest.raises(ModelError, match="unexpected: model.extra"):
        load_by_name(model, {**state, "model.extra": torch.zeros(1)}, what="AdapFu")
    wrong = {**state, "model.norm.weight": torch.zeros(3)}
    with pytest.raises(ModelError, match="wrong shape"):
        load_by_name(model, wrong, what="AdapFu")


def test_mixed_layer_types_cannot_be_layer_dropped() -> None:
    from fedtune.models.layers import composite_config

    config = LlamaConfig(num_hidden_layers=2)
    config.layer_types = ["full_attention", "sliding_attention"]
    with pytest.raises(ModelError, match="mixes decoder layer types"):
        composite_config(config, 1)
    config.layer_types = ["full_attention", "full_attention"]
    assert composite_config(config, 3).layer_types == ["full_attention"] * 3


def test_fedbiot_edges_placement_is_fedots_split_with_fedbiots_schedule() -> None:
    """The ablation's adapter_placement: edges: adapter_size/2 first + last layers."""
    from pydantic import TypeAdapter, ValidationError

    from fedtune.algorithms.fedbiot.algorithm import FedBiOT
    from fedtune.config.algorithms import AlgorithmConfig
    from fedtune.models.layers import layer_extract, offsite_split

    adapter = TypeAdapter(AlgorithmConfig)
    edges = FedBiOT(adapter.validate_python({"name": "fedbiot", "adapter_size": 4, "adapter_placement": "edges"}))
    top = FedBiOT(adapter.validate_python({"name": "fedbiot", "adapter_size": 4}))
    assert edges.split(8) == offsite_split(8, 0.2, 2)
    assert edges.split(8).adapter == (0, 1, 6, 7)
    assert top.split(8) == layer_extract(8, 4, 0.2) and top.split(8).adapter == (4, 5, 6, 7)
    assert edges.adapter_size_tag() == "first2+last2" and edges.align_steps == 10
    with pytest.raises(ValidationError, match="even adapter_size"):
        adapter.validate_python({"name": "fedbiot", "adapter_size": 3, "adapter_placement": "edges"})
