"""Emulator alignment under DeepSpeed ZeRO-2/3 (single process, CPU, gloo) equals plain torch.

The first DeepSpeed initialisation on a machine builds a C++ extension (about a minute, cached
in ~/.cache/torch_extensions), hence the slow mark; the test still runs in the default suite.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from fedtune.algorithms.fedbiot.config import FedBiOTConfig
from fedtune.algorithms.fedbiot.package import select
from fedtune.algorithms.fedbiot.server import Provider
from fedtune.config.sections import DeepSpeedSection
from fedtune.core.errors import ConfigError
from fedtune.training.deepspeed import build_config, load_config_file

_RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DS_ACCELERATOR")


def _align(provider: Provider) -> dict[str, torch.Tensor]:
    emulator = select(provider.base, provider.names("emulator"))
    trained, _ = provider.align(emulator, provider.initial_adapter(), steps=3, tag="ds")
    return trained


@pytest.mark.slow
def test_zero2_and_zero3_emulators_equal_plain_torch(
    make_provider: Callable[..., Provider], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in _RANK_VARIABLES:  # restored after the test; the wrapper sets them itself
        monkeypatch.delenv(name, raising=False)
    common = {"kl_lambda": 0.5, "align_lr": 0.005, "align_batch_size": 4}
    reference = _align(make_provider(**common))
    stage3_file = tmp_path / "ds.json"
    stage3_file.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    for section in ({"zero_stage": 2}, {"config_path": str(stage3_file)}):
        trained = _align(make_provider(deepspeed=section, **common))
        assert trained.keys() == reference.keys()
        for key, value in reference.items():
            torch.testing.assert_close(trained[key], value, rtol=1e-4, atol=1e-5, msg=f"{section}: {key}")
        moved = max(float((reference[k] - provider_value).abs().max())
                    for k, provider_value in select(make_provider().base, list(reference)).items())
        assert moved > 1e-4  # the steps did change the emulator, so equality means something


@pytest.mark.slow
def test_bf16_alignment_under_deepspeed_matches_torch_and_stores_the_emulator_in_bf16(
    make_provider: Callable[..., Provider], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedtune.config.job import TrainingConfig
    from tests.unit.fedbiot.conftest import tiny_context

    for name in _RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    bf16 = TrainingConfig(batch_size=4, max_seq_len=96, precision="bf16")
    common = {"kl_lambda": 0.5, "align_lr": 0.005, "align_batch_size": 4}
    torch_path = make_provider(tiny_context(training=bf16), **common)
    assert {p.dtype for p in torch_path.ctx.base_model().parameters()} == {torch.bfloat16}
    reference = _align(torch_path)
    trained = _align(make_provider(tiny_context(training=bf16), deepspeed={"zero_stage": 2}, **common))
    # Trained in fp32, stored in the model's dtype (issue 13: emulator tensors in the model's dtype).
    assert {t.dtype for t in [*reference.values(), *trained.values()]} == {torch.bfloat16}
    for key, value in reference.items():
        torch.testing.assert_close(trained[key].float(), value.float(), rtol=0.0, atol=1e-2, msg=key)


def test_config_file_errors_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="deepspeed.config_path=.*does not exist"):
        load_config_file(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot be read as JSON"):
        load_config_file(str(bad))
    with pytest.raises(ConfigError, match="ZeRO stage 1 is not supported"):
        build_config(micro_batch_size=2, base={"zero_optimization": {"stage": 1}})


def test_inline_config_fills_batch_sizes_and_keeps_file_values() -> None:
    inline = build_config(micro_batch_size=4, zero_stage=3, bf16=True)
    assert inline["zero_optimization"] == {"stage": 3} and inline["bf16"] == {"enabled": True}
    assert inline["train_micro_batch_size_per_gpu"] == 4
    from_file = build_config(
        micro_batch_size=4, base={"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 1}
    )
    assert from_file["train_micro_batch_size_per_gpu"] == 1


def test_section_refuses_file_plus_inline_settings() -> None:
    with pytest.raises(ValueError, match="conflicts with inline settings"):
        DeepSpeedSection(config_path="ds.json", zero_stage=2)
    config = FedBiOTConfig(name="fedbiot", deepspeed={"zero_stage": 3})
    assert config.deepspeed is not None and config.deepspeed.zero_stage == 3


def test_partial_launcher_environment_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedtune.training.deepspeed import ensure_single_process_env

    for name in _RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ConfigError, match=r"partial distributed environment, missing \['WORLD_SIZE'"):
        ensure_single_process_env()


def test_config_file_must_hold_an_object(tmp_path: Path) -> None:
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="holds a list, not an object"):
        load_config_file(str(listed))
