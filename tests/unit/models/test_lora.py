"""LoRA helpers: defaults per architecture, strict named state, training view, export."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase

from fedtune.core.errors import ModelError
from fedtune.models import (
    adapter_shapes,
    adapter_state,
    apply_lora,
    describe,
    load_adapter,
    load_pretrained,
    merge_and_export,
    save_adapter,
    set_adapter_state,
    train_tokenizer,
    trainable_parameters,
)

from .helpers import ARCHS, logits, sample_ids, tiny

# arch -> (module the default targets, number of adapted modules in 2 layers)
DEFAULTS = {"llama": ({"q_proj", "v_proj"}, 4), "gpt2": ({"c_attn"}, 2)}


def lora(arch: str, *, seed: int = 0, r: int = 4, targets: list[str] | None = None) -> PeftModel:
    return apply_lora(
        tiny(arch), r=r, alpha=8.0, dropout=0.0, target_modules=targets, arch=arch, seed=seed
    )


def randomized(model: PeftModel, seed: int) -> dict[str, torch.Tensor]:
    """Adapter tensors with nonzero B, so the adapter changes the model's output."""
    gen = torch.Generator().manual_seed(seed)
    state = {k: torch.randn(v.shape, generator=gen) * 0.1 for k, v in adapter_state(model).items()}
    set_adapter_state(model, state)
    return state


@pytest.mark.parametrize("arch", ARCHS)
def test_default_targets_per_architecture(arch: str) -> None:
    model = lora(arch)
    targets, count = DEFAULTS[arch]
    assert set(model.peft_config["default"].target_modules) == targets
    assert model.peft_config["default"].fan_in_fan_out is (arch == "gpt2")
    names = adapter_shapes(model)
    assert len(names) == 2 * count  # lora_A and lora_B per adapted module
    assert all(any(f".{t}.lora_" in n for t in targets) for n in names)


def test_gpt2_c_attn_adapter_shapes_follow_fused_qkv() -> None:
    shapes = adapter_shapes(lora("gpt2", r=4))
    a = next(v for k, v in shapes.items() if k.endswith("c_attn.lora_A.weight"))
    b = next(v for k, v in shapes.items() if k.endswith("c_attn.lora_B.weight"))
    assert a == (4, 32) and b == (3 * 32, 4)


# arch -> (every linear layer of a block, adapted modules in 2 layers)
ALL_LINEAR = {
    "llama": ({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, 14),
    "gpt2": ({"c_attn", "c_proj", "c_fc"}, 8),  # c_proj: attention output and MLP output
}


@pytest.mark.parametrize("arch", ARCHS)
def test_all_linear_adapts_every_linear_layer_of_each_architecture(arch: str) -> None:
    model = lora(arch, targets=["all-linear"])
    targets, count = ALL_LINEAR[arch]
    names = adapter_shapes(model)
    assert {n.split(".lora_")[0].rsplit(".", 1)[1] for n in names} == targets
    assert len(names) == 2 * count
    assert not any("lm_head" in n or "wte" in n or "embed" in n for n in names)


def test_explicit_targets_override_default() -> None:
    model = lora("llama", targets=["k_proj"])
    assert all(".k_proj.lora_" in n for n in adapter_shapes(model))


@pytest.mark.parametrize("arch", ARCHS)
def test_fresh_adapter_leaves_outputs_unchanged_and_only_it_trains(arch: str) -> None:
    ids = sample_ids()
    before = logits(tiny(arch), ids)
    model = lora(arch)
    assert torch.equal(logits(model, ids), before)  # lora_B starts at zero
    info = describe(model)
    assert info["peft"] is True
    assert info["params_trainable"] == sum(t.numel() for t in adapter_state(model).values())


@pytest.mark.parametrize("arch", ARCHS)
def test_lora_seed_makes_init_reproducible(arch: str) -> None:
    a, b, c = (adapter_state(lora(arch, seed=s)) for s in (5, 5, 6))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize("arch", ARCHS)
def test_state_round_trip_gives_bitwise_equal_logits(arch: str) -> None:
    source = lora(arch, seed=1)
    randomized(source, seed=2)
    target = lora(arch, seed=9)
    ids = sample_ids()
    assert not torch.equal(logits(source, ids), logits(target, ids))
    set_adapter_state(target, adapter_state(source))
    assert torch.equal(logits(source, ids), logits(target, ids))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("targets", [None, ["all-linear"]])
def test_set_adapter_state_loads_what_peft_loads(arch: str, targets: list[str] | None) -> None:
    """The direct copy into the adapter's parameters leaves every tensor of the model (and
    its gradients' owners) exactly as PEFT's own loader leaves them."""
    from peft import set_peft_model_state_dict

    source = lora(arch, seed=1, targets=targets)
    state = randomized(source, seed=2)
    ours, peft_loaded = lora(arch, seed=9, targets=targets), lora(arch, seed=9, targets=targets)
    live = dict(ours.named_parameters())
    set_adapter_state(ours, state)
    set_peft_model_state_dict(peft_loaded, state, adapter_name="default")
    theirs = peft_loaded.state_dict()
    assert ours.state_dict().keys() == theirs.keys()
    assert all(torch.equal(v, theirs[k]) for k, v in ours.state_dict().items())
    assert all(p is live[n] for n, p in ours.named_parameters())  # loaded in place
    assert any(not torch.equal(v, adapter_state(lora(arch, seed=9, targets=targets))[k])
               for k, v in adapter_state(ours).items())


def test_adapter_state_is_a_detached_cpu_copy() -> None:
    model = lora("llama")
    state = adapter_state(model)
    for tensor in state.values():
        assert tensor.device.type == "cpu" and tensor.is_contiguous()
        assert not tensor.requires_grad
        tensor.add_(1.0)  # mutating the copy must not touch the model
    assert all(not torch.equal(adapter_state(model)[k], v) for k, v in state.items())


def test_set_rejects_missing_unexpected_and_misshaped_names_and_loads_nothing() -> None:
    model = lora("llama")
    before = adapter_state(model)
    good = {k: torch.ones_like(v) for k, v in before.items()}
    names = sorted(good)
    bad = dict(good)
    del bad[names[0]]
    bad["base_model.model.lm_head.lora_A.weight"] = torch.zeros(4, 32)
    bad[names[1]] = torch.zeros(3, 3)
    with pytest.raises(ModelError) as info:
        set_adapter_state(model, bad)
    message = str(info.value)
    assert f"1 missing: {names[0]}" in message
    assert "1 unexpected: base_model.model.lm_head.lora_A.weight" in message
    assert f"{names[1]}: got (3, 3), expected {tuple(before[names[1]].shape)}" in message
    after = adapter_state(model)
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_adapter_shapes_follow_a_model_whose_adapter_changed() -> None:
    # The shapes are kept per model between calls; a model whose adapter tensors change
    # must be checked against its new shapes.
    model = lora("llama", r=4)
    name = next(n for n in adapter_shapes(model) if n.endswith("lora_A.weight"))
    assert adapter_shapes(model)[name] == (4, 32)
    module_name, _, _ = name.removeprefix("base_model.model.").rpartition(".lora_A")
    module = model.base_model.model.get_submodule(module_name)
    module.lora_A["default"].weight = torch.nn.Parameter(torch.zeros(2, 32))
    assert adapter_shapes(model)[name] == (2, 32)
    with pytest.raises(ModelError, match="with wrong shape"):
        set_adapter_state(model, adapter_state(lora("llama", r=4)))


def test_set_rejects_adapter_of_other_rank() -> None:
    with pytest.raises(ModelError, match="with wrong shape"):
        set_adapter_state(lora("gpt2", r=4), adapter_state(lora("gpt2", r=2)))


@pytest.mark.parametrize("arch", ARCHS)
def test_trainable_parameters_are_the_live_adapter_tensors(arch: str) -> None:
    model = lora(arch)
    params = trainable_parameters(model)
    assert params.keys() == adapter_state(model).keys()
    name = min(params)
    with torch.no_grad():
        params[name].fill_(0.5)
    assert torch.equal(adapter_state(model)[name], torch.full_like(params[name], 0.5))


def test_trainable_parameters_rejects_unfrozen_base_weights() -> None:
    model = lora("llama")
    model.get_base_model().lm_head.weight.requires_grad_(True)
    with pytest.raises(ModelError, match="trainable but not adapter: .*lm_head.weight"):
        trainable_parameters(model)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        pytest.param({"arch": "gpt2"}, "does not match the model's model_type='llama'", id="arch"),
        pytest.param({"arch": "bert"}, "arch='bert' is not one of", id="unknown-arch"),
        pytest.param({"r": 0}, "r=0 must be >= 1", id="rank"),
        pytest.param({"dropout": 1.0}, r"dropout=1.0 must be in \[0, 1\)", id="dropout"),
        pytest.param(
            {"target_modules": ["q_proj", "c_attn"]},
            r"\['c_attn'\] match no module .*available: .*q_proj",
            id="target",
        ),
    ],
)
def test_apply_lora_rejects_bad_settings(kwargs: dict[str, object], expected: str) -> None:
    args: dict[str, object] = {
        "r": 4,
        "alpha": 8.0,
        "dropout": 0.0,
        "target_modules": None,
        "arch": "llama",
    }
    args.update(kwargs)
    with pytest.raises(ModelError, match=expected):
        apply_lora(tiny("llama"), **args)  # type: ignore[arg-type]


def test_helpers_reject_plain_models() -> None:
    with pytest.raises(ModelError, match="adapter_state needs a PEFT model, got LlamaForCausalLM"):
        adapter_state(tiny("llama"))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return train_tokenizer(["tiny tokenizer for export tests"] * 4, vocab_size=300)


@pytest.mark.parametrize("arch", ARCHS)
def test_merged_export_reloads_with_the_adapted_logits(
    arch: str, tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    model = lora(arch)
    randomized(model, seed=3)
    ids = sample_ids()
    expected = logits(model, ids)
    assert not torch.allclose(expected, logits(tiny(arch), ids))
    out = merge_and_export(model, tokenizer, tmp_path / "merged")
    assert (out / "model.safetensors").is_file()
    assert not list(out.glob("*.bin")) and not list(out.glob("adapter_*"))
    reloaded, tok = load_pretrained(str(out))
    assert not isinstance(reloaded, PeftModel)
    torch.testing.assert_close(logits(reloaded, ids), expected, rtol=1e-5, atol=1e-5)
    assert tok.decode(tok("round trip")["input_ids"]) == "round trip"
    # The export worked on a copy: the PEFT model is still an unmerged adapter model.
    assert torch.equal(logits(model, ids), expected)
    assert adapter_shapes(model)


@pytest.mark.parametrize("arch", ARCHS)
def test_saved_adapter_reloads_onto_a_fresh_base(arch: str, tmp_path: Path) -> None:
    model = lora(arch)
    randomized(model, seed=4)
    out = save_adapter(model, tmp_path / "adapter")
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in out.iterdir()}
    assert not list(out.glob("*.bin"))
    reloaded = load_adapter(tiny(arch), out)
    ids = sample_ids()
    assert torch.equal(logits(reloaded, ids), logits(model, ids))
    assert trainable_parameters(load_adapter(tiny(arch), out, trainable=True))


def test_load_adapter_names_missing_files(tmp_path: Path) -> None:
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(ModelError, match=r"lacks \['adapter_model.safetensors'\]"):
        load_adapter(tiny("llama"), tmp_path)


def test_merged_export_is_a_valid_hf_directory(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    out = merge_and_export(lora("llama"), tokenizer, tmp_path)
    model = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    assert model.config.model_type == "llama"
