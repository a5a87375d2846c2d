"""``training.compile`` and ``training.kernels``: the compiled path trains what the plain path
trains (within a stated tolerance), and what a machine cannot run is a clear error."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from fedtune.config.job import TrainingConfig
from fedtune.core.devices import BACKEND_ENV, check_acceleration
from fedtune.core.errors import ConfigError
from fedtune.models import lora
from fedtune.models.tiny import build_tiny_model
from fedtune.training import acceleration
from fedtune.training.local import train_local
from fedtune.training.precision import Runtime

#: Adapter weights and losses of the compiled path against the plain one (fp32, CPU). The
#: tiny model under inductor differed by at most 2.4e-7 after three steps (docs/benchmarks.md).
ATOL, RTOL = 1e-5, 1e-4
LIGER = importlib.util.find_spec("liger_kernel") is not None


def _train(
    compile_forward: bool, device: str = "cpu", kernels: str = "none"
) -> tuple[list[float], dict[str, torch.Tensor], list[str]]:
    model = build_tiny_model("llama", vocab_size=96, hidden_size=32, num_layers=2, num_heads=2,
                             intermediate_size=64, max_position_embeddings=64, seed=1,
                             bos_token_id=1, eos_token_id=2, pad_token_id=0)
    peft = lora.apply_lora(model, r=4, alpha=8, dropout=0.0, target_modules=None, arch="llama")
    gen = torch.Generator().manual_seed(3)
    batches = []
    for length in (16, 16, 12):  # a new length: the compiled forward meets a second shape
        ids = torch.randint(3, 96, (2, length), generator=gen)
        batches.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
    config = TrainingConfig(local_steps=3, batch_size=2, device=device, compile=compile_forward,
                            kernels=kernels)
    runtime = Runtime.of(config)
    runtime.prepare(runtime.place(peft))  # the kernels are patched in here
    losses: list[float] = []
    train_local(peft, lora.trainable_parameters(peft), batches, config, seed=5,
                progress=lambda _step, loss: losses.append(loss))
    return losses, {k: v.cpu() for k, v in lora.adapter_state(peft).items()}, sorted(peft.state_dict())


def _assert_close(plain: tuple[list[float], dict[str, torch.Tensor], list[str]],
                  other: tuple[list[float], dict[str, torch.Tensor], list[str]],
                  atol: float, rtol: float) -> None:
    assert other[2] == plain[2]  # no wrapper prefix in what is stored
    assert other[0] == pytest.approx(plain[0], abs=atol, rel=rtol)
    for name, value in plain[1].items():
        torch.testing.assert_close(other[1][name], value, atol=atol, rtol=rtol)
    assert any(not v.equal(torch.zeros_like(v)) for v in other[1].values())  # it trained


@pytest.mark.slow
def test_compiled_training_matches_the_plain_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # aot_eager traces and differentiates the same graphs as inductor without generating C++
    # kernels (minutes on a CPU); the GPU check runs inductor itself.
    monkeypatch.setenv(BACKEND_ENV, "aot_eager")
    torch.manual_seed(0)
    plain = _train(False)
    torch.manual_seed(0)
    _assert_close(plain, _train(True), ATOL, RTOL)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (scripts/gpu_check.sh)")
@pytest.mark.parametrize(("compile_forward", "kernels"), [(True, "none"), (False, "liger"), (True, "liger")])
def test_compile_and_kernels_on_cuda_match_the_plain_path(compile_forward: bool, kernels: str) -> None:
    if kernels == "liger" and not LIGER:
        pytest.skip("liger-kernel is not installed")
    torch.manual_seed(0)
    plain = _train(False, "cuda")
    torch.manual_seed(0)  # fp32: Liger's fused kernels reorder sums, hence the looser bound
    _assert_close(plain, _train(compile_forward, "cuda", kernels), 1e-4, 1e-3)


def test_liger_kernels_on_the_cpu_are_refused() -> None:
    with pytest.raises(ConfigError, match="kernels: liger needs a CUDA GPU, but the job trains on cpu"):
        Runtime.of(TrainingConfig(device="cpu", kernels="liger"))


@pytest.mark.skipif(LIGER, reason="liger-kernel is installed here")
def test_liger_kernels_without_the_package_are_refused() -> None:
    with pytest.raises(ConfigError, match="liger-kernel package is not installed") as err:
        check_acceleration(False, "liger", "cuda")
    assert "pip install liger-kernel" in err.value.fix


@pytest.mark.skipif(not LIGER, reason="needs liger-kernel (the GPU check installs it)")
def test_liger_kernels_for_a_model_type_it_lacks_are_refused() -> None:
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    acceleration.check_liger_family("llama", MODEL_TYPE_TO_APPLY_LIGER_FN)
    with pytest.raises(ConfigError, match="no kernels for model type 'gpt2'"):
        acceleration.check_liger_family("gpt2", MODEL_TYPE_TO_APPLY_LIGER_FN)


def test_compile_on_a_cpu_without_a_compiler_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no compiler on it
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    with pytest.raises(ConfigError, match="no C\\+\\+ compiler is on PATH"):
        Runtime.of(TrainingConfig(device="cpu", compile=True))
    Runtime.of(TrainingConfig(device="cpu"))  # the plain path needs none


def test_plain_training_is_not_wrapped() -> None:
    model = torch.nn.Linear(2, 2)
    assert Runtime.of(TrainingConfig(device="cpu")).forward(model) is model
    compiled = acceleration.training_forward(model, True)
    assert compiled is not model and acceleration.training_forward(model, True) is compiled
