"""Device, precision and gradient checkpointing (``fedtune.training.precision``)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch

from fedtune.config import parse_job
from fedtune.config.job import TrainingConfig
from fedtune.core.devices import resolve_device
from fedtune.core.errors import ConfigError
from fedtune.models import lora as lora_helpers
from fedtune.training.context import ProviderContext
from fedtune.training.local import train_local
from fedtune.training.precision import Runtime

NO_CUDA = not torch.cuda.is_available()


def tiny_job(**training: Any) -> Any:
    return parse_job({
        "name": "precision",
        "model": {"source": "tiny", "arch": "llama", "hidden_size": 32, "num_layers": 2,
                  "num_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64},
        "tokenizer": "builtin",
        "algorithm": {"name": "fedavg"},
        "tenants": [{"name": "tenant-a", "data_uri": "a.jsonl"}],
        "tracking": {"backend": "none"},
        "training": {"local_steps": 3, "batch_size": 4, **training},
    })


def batches(vocab: int, count: int = 3) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(3, vocab, (count, 4, 16), generator=generator)
    return [{"input_ids": i, "attention_mask": torch.ones_like(i), "labels": i} for i in ids]


def train(job: Any) -> tuple[float, dict[str, torch.Tensor], Any]:
    ctx = ProviderContext.from_job(job)
    model = ctx.peft_model()
    vocab = len(ctx.tokenizer())
    result = train_local(model, lora_helpers.trainable_parameters(model),
                         iter(batches(vocab)), job.training, seed=1)
    return result.loss, lora_helpers.adapter_state(model), ctx


def test_the_defaults_are_fp32_on_the_cpu_and_change_nothing() -> None:
    training = TrainingConfig()
    assert (training.device, training.precision, training.gradient_checkpointing) == ("auto", "fp32", False)
    runtime = Runtime.of(training)
    if NO_CUDA:
        assert runtime.device == torch.device("cpu")
    assert isinstance(runtime.autocast(), contextlib.nullcontext)
    assert runtime.stepper(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)).scaler is None
    if NO_CUDA:  # the very tensors, not copies: the fp32 CPU path stays bitwise as before
        batch = {"input_ids": torch.ones(2, 3, dtype=torch.long)}
        assert runtime.batch(batch)["input_ids"] is batch["input_ids"]


def test_bf16_loads_the_base_in_bf16_and_keeps_the_adapter_fp32() -> None:
    loss, adapter, ctx = train(tiny_job(precision="bf16", device="cpu"))
    base_dtypes = {p.dtype for n, p in ctx.base_model().named_parameters() if "lora_" not in n}
    assert base_dtypes == {torch.bfloat16}
    assert {t.dtype for t in adapter.values()} == {torch.float32}
    assert all(t.device.type == "cpu" for t in adapter.values())
    fp32_loss, _, _ = train(tiny_job(device="cpu"))
    # The same weights in bf16 (built in bf16 from the same seed) give a close, not equal loss.
    assert loss == pytest.approx(fp32_loss, rel=0.05) and loss != fp32_loss


def test_gradient_checkpointing_gives_the_same_loss_and_update() -> None:
    loss_off, adapter_off, _ = train(tiny_job(device="cpu"))
    loss_on, adapter_on, ctx = train(tiny_job(device="cpu", gradient_checkpointing=True))
    assert ctx.base_model().is_activation_checkpointing
    assert loss_on == pytest.approx(loss_off, rel=1e-5)
    for name, tensor in adapter_off.items():
        torch.testing.assert_close(adapter_on[name], tensor, rtol=1e-4, atol=1e-6)


def test_fp16_on_the_cpu_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="fp16.*device: cpu.*bf16"):
        tiny_job(precision="fp16", device="cpu")
    if NO_CUDA:  # auto resolves to the CPU here
        with pytest.raises(ConfigError, match="fp16.*CPU") as info:
            resolve_device(TrainingConfig(precision="fp16"))
        assert "bf16" in info.value.fix


@pytest.mark.skipif(not NO_CUDA, reason="checks the error of a machine without CUDA")
def test_cuda_without_cuda_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="training.device='cuda'.*no CUDA device") as info:
        Runtime.of(TrainingConfig(device="cuda"))
    assert "auto" in info.value.fix and info.value.exit_code == 2


def lora_a_input_dtypes(model: torch.nn.Module) -> tuple[set[torch.dtype], list[Any]]:
    """Record the dtype of every input a LoRA ``A`` matrix receives."""
    seen: set[torch.dtype] = set()
    hooks = [module.register_forward_pre_hook(lambda _m, args: seen.add(args[0].dtype))
             for name, module in model.named_modules() if name.endswith("lora_A.default")]
    return seen, hooks


def test_bf16_training_feeds_lora_its_bf16_inputs_with_the_same_gradients() -> None:
    job = tiny_job(precision="bf16", device="cpu")
    ctx = ProviderContext.from_job(job)
    model = ctx.peft_model()
    runtime = Runtime.of(job.training)
    batch = batches(len(ctx.tokenizer()))[0]
    seen, hooks = lora_a_input_dtypes(model)

    def gradients(uncast: bool) -> dict[str, torch.Tensor]:
        model.zero_grad()
        with runtime.adapter_inputs_uncast(model) if uncast else contextlib.nullcontext():
            with runtime.autocast():
                model(**batch).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    cast = gradients(uncast=False)
    assert seen == {torch.float32}  # PEFT's own cast to the fp32 adapter
    seen.clear()
    uncast = gradients(uncast=True)
    assert seen == {torch.bfloat16}  # as they come: autocast casts once, for the matmul
    assert cast.keys() == uncast.keys()
    for name, grad in cast.items():
        assert torch.equal(grad, uncast[name]), name  # bitwise: the cast was wasted work

    seen.clear()  # train_local does it for the whole loop, and restores PEFT's default after
    train_local(model, lora_helpers.trainable_parameters(model), iter(batches(len(ctx.tokenizer()))),
                job.training, seed=1)
    assert seen == {torch.bfloat16}
    seen.clear()
    model(**batch)
    assert seen == {torch.float32}
    for hook in hooks:
        hook.remove()


def test_fp32_training_leaves_lora_input_casting_alone() -> None:
    model = ProviderContext.from_job(tiny_job(device="cpu")).peft_model()
    assert isinstance(Runtime().adapter_inputs_uncast(model), contextlib.nullcontext)


def test_cuda_with_cpu_workers_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="worker_devices: cpu"):
        parse_job({**tiny_job().model_dump(mode="json"), "training": {"device": "cuda"},
                   "engine": {"name": "local", "worker_devices": "cpu"}})


def test_the_fp16_stepper_unscales_before_the_step_and_skips_overflow() -> None:
    param = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    optimizer = torch.optim.SGD([param], lr=0.5)
    stepper = Runtime(precision="fp16").stepper(optimizer)
    assert stepper.scaler is not None and stepper.scaler.get_scale() > 1
    stepper.backward((param**2).sum())
    stepper.unscale()
    torch.testing.assert_close(param.grad, torch.tensor([2.0, 4.0]))  # the true gradient
    stepper.step()
    torch.testing.assert_close(param.detach(), torch.tensor([0.0, 0.0]))
    optimizer.zero_grad()
    scale = stepper.scaler.get_scale()
    stepper.backward((param * float("inf")).sum())
    stepper.step()  # an overflowing step leaves the weights alone and lowers the scale
    torch.testing.assert_close(param.detach(), torch.tensor([0.0, 0.0]))
    assert stepper.scaler.get_scale() < scale


@pytest.mark.skipif(NO_CUDA, reason="needs a CUDA device")
def test_cuda_trains_on_the_gpu_and_stores_cpu_fp32() -> None:  # pragma: no cover - GPU only
    loss, adapter, ctx = train(tiny_job(device="cuda", precision="bf16"))
    assert next(ctx.base_model().parameters()).device.type == "cuda"
    assert {(t.device.type, t.dtype) for t in adapter.values()} == {("cpu", torch.float32)}
    assert loss == loss
