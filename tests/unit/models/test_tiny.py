"""build_tiny_model: offline, seeded, float32, eval mode, both architectures."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2LMHeadModel, LlamaForCausalLM

from fedtune.core.errors import ModelError
from fedtune.models import build_tiny_model, describe

from .helpers import ARCHS, logits, sample_ids, tiny, tiny_kwargs


@pytest.mark.parametrize(
    ("arch", "cls"), [("llama", LlamaForCausalLM), ("gpt2", GPT2LMHeadModel)], ids=ARCHS
)
def test_builds_requested_shape(arch: str, cls: type) -> None:
    model = tiny(arch)
    assert isinstance(model, cls)
    assert not model.training
    assert all(p.dtype == torch.float32 for p in model.parameters())
    cfg = model.config
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers) == (300, 32, 2)
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (1, 2, 0)
    out = logits(model, sample_ids())
    assert out.shape == (2, 12, 300)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_same_seed_gives_bitwise_equal_weights(arch: str) -> None:
    a, b = tiny(arch, seed=3).state_dict(), tiny(arch, seed=3).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("arch", ARCHS)
def test_other_seed_gives_other_weights(arch: str) -> None:
    a, b = tiny(arch, seed=3).state_dict(), tiny(arch, seed=4).state_dict()
    assert any(not torch.equal(a[k], b[k]) for k in a)


def test_building_leaves_global_rng_untouched() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tiny("llama", seed=99)
    assert torch.equal(torch.rand(3), expected)


def test_gpt2_has_no_dropout_so_train_mode_is_deterministic() -> None:
    model = tiny("gpt2").train()
    ids = sample_ids()
    assert torch.equal(logits(model, ids), logits(model, ids))


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        pytest.param({"hidden_size": 30}, "not divisible by num_heads=4", id="heads-divide"),
        pytest.param({"hidden_size": 12, "num_heads": 4}, "must be even", id="rope-even-head"),
        pytest.param({"eos_token_id": 300}, "eos_token_id=300 is outside", id="eos-range"),
        pytest.param({"num_layers": 0}, "num_layers=0 must be >= 1", id="layers"),
    ],
)
def test_bad_arguments_raise_model_error(overrides: dict[str, int], expected: str) -> None:
    with pytest.raises(ModelError, match=expected):
        build_tiny_model("llama", **tiny_kwargs(**overrides))


def test_unknown_arch_raises_model_error() -> None:
    with pytest.raises(ModelError, match="arch='mistral' is not one of"):
        build_tiny_model("mistral", **tiny_kwargs())  # type: ignore[arg-type]


def test_errors_are_collected_into_one_message() -> None:
    with pytest.raises(ModelError) as info:
        build_tiny_model("gpt2", **tiny_kwargs(hidden_size=30, pad_token_id=-1))
    assert "not divisible" in str(info.value) and "pad_token_id=-1" in str(info.value)


@pytest.mark.parametrize("arch", ARCHS)
def test_describe_reports_shape_and_counts(arch: str) -> None:
    model = tiny(arch)
    info = describe(model)
    assert info["arch"] == arch
    assert (info["layers"], info["hidden"], info["vocab"]) == (2, 32, 300)
    assert info["params_total"] == sum(p.numel() for p in model.parameters())
    assert info["params_trainable"] == info["params_total"]
    assert info["peft"] is False
