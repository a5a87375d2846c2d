"""How a job's models run: device, precision and gradient checkpointing, in one place.

Every training, distillation, generation and evaluation path asks a :class:`Runtime` (built
from ``training``) instead of deciding for itself:

- :attr:`Runtime.dtype` is the dtype base models are *loaded* in (``dtype=`` of
  ``from_pretrained`` / ``from_config``), so a bf16 model never exists in fp32 first.
- :meth:`Runtime.place` moves a model to the device, :meth:`Runtime.batch` a batch.
- :meth:`Runtime.autocast` wraps forward passes (bf16/fp16 autocast; nothing for fp32).
- :class:`Stepper` runs backward and the optimizer step, with a GradScaler for fp16 only.
- :meth:`Runtime.prepare` turns on gradient checkpointing (non-reentrant, so a frozen base
  under PEFT needs no ``enable_input_require_grads``) and patches in ``training.kernels``;
  :meth:`Runtime.forward` is what training loops call (compiled under ``training.compile``,
  see :mod:`fedtune.training.acceleration`).

LoRA adapters stay fp32 whatever the precision (PEFT upcasts them, ``autocast_adapter_dtype``),
so aggregation, secure aggregation and DP arithmetic are fp32, and stores only ever receive CPU
tensors (the codec moves them). With the defaults (fp32 on the CPU, no checkpointing) every
method here is a no-op: runs stay bitwise equal to runs before precision existed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fedtune.config.job import TrainingConfig
from fedtune.core.devices import resolve_device
from fedtune.training import acceleration

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Runtime:
    """Device, precision and checkpointing of one job (see the module docstring)."""

    device: torch.device = torch.device("cpu")
    precision: str = "fp32"
    gradient_checkpointing: bool = False
    compile: bool = False
    kernels: str = "none"

    @classmethod
    def of(cls, training: TrainingConfig | None) -> Runtime:
        """The runtime ``training`` asks for on this machine (None: fp32 on the CPU).

        Raises:
            ConfigError: ``device: cuda`` without CUDA here, or fp16 on the CPU; compile or
                kernels this machine cannot run (:func:`fedtune.core.devices.check_acceleration`).
        """
        if training is None:
            return cls()
        return cls(
            device=torch.device(resolve_device(training)),
            precision=training.precision,
            gradient_checkpointing=training.gradient_checkpointing,
            compile=training.compile,
            kernels=training.kernels,
        )

    @property
    def dtype(self) -> torch.dtype:
        """The dtype base models load in."""
        return DTYPES[self.precision]

    @property
    def mixed(self) -> bool:
        """Whether forward passes run under autocast (bf16 or fp16)."""
        return self.precision != "fp32"

    def place(self, model: nn.Module) -> nn.Module:
        """``model`` on the device (in place; a no-op where it already is)."""
        if self._moves(model):
            model.to(self.device)
        return model

    def _moves(self, model: nn.Module) -> bool:
        first = next(iter(model.parameters()), None)
        # A meta skeleton (the preflight's) has no data to move.
        return first is not None and first.device not in (self.device, torch.device("meta"))

    def batch(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``batch`` with every tensor on the device (the same tensors on the CPU)."""
        return {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    def tensors(self, values: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """``values`` on the device."""
        return [v.to(self.device) for v in values]

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The context forward passes run in: autocast to the precision, nothing for fp32."""
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def adapter_inputs_uncast(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """While mixed precision trains ``model``, PEFT's LoRA layers take their inputs as they
        come instead of casting them to the fp32 adapter's dtype first: autocast casts them
        straight back for the matmul, so with LoRA dropout 0 the products (and gradients) are
        bitwise the same, minus two full-activation casts per adapted layer and pass. On an
        H100 (1B Llama, LoRA on every linear layer, bf16) those casts were about a fifth of the
        client step's GPU time (docs/benchmarks.md). With dropout > 0 the drop mask is drawn for
        the bf16 tensor, so it may differ from the fp32 one (same distribution). Nothing changes
        for fp32 or for a model without PEFT layers; use it around forward passes that run under
        :meth:`autocast` only (without autocast a bf16 input would meet fp32 adapter weights)."""
        if not self.mixed:
            return contextlib.nullcontext()
        from peft.helpers import disable_input_dtype_casting  # peft imports lazily, as elsewhere

        return disable_input_dtype_casting(model)

    def master(self, params: Mapping[str, nn.Parameter] | Sequence[nn.Parameter]) -> None:
        """Keep the weights about to be trained in fp32 (in place), as PEFT keeps LoRA
        adapters: a bf16/fp16 model trains fp32 master weights under autocast, so updates,
        aggregation and what is stored are fp32. Call it before building the optimizer."""
        values = params.values() if isinstance(params, Mapping) else params
        for param in values:
            if param.is_floating_point() and param.dtype != torch.float32:
                param.data = param.data.float()

    def forward(self, model: nn.Module) -> Any:
        """What a training loop calls for ``model``'s forward passes: the model, or under
        ``training.compile`` its compiled wrapper (the same parameters)."""
        return acceleration.training_forward(model, self.compile)

    def prepare(self, model: nn.Module) -> nn.Module:
        """Turn on gradient checkpointing and patch in ``training.kernels`` where the job asks
        for them (Hugging Face models, also under a PEFT wrapper); the model is returned."""
        acceleration.apply_kernels(model, self.kernels)
        if self.gradient_checkpointing:
            target = _hf_model(model)
            if target is not None and not _checkpointing(target):
                # transformers 5 names it activation checkpointing (the old name warns).
                enable = getattr(target, "activation_checkpointing_enable", None)
                if enable is not None:
                    enable(activation_checkpointing_kwargs={"use_reentrant": False})
                else:  # pragma: no cover - transformers 4
                    target.gradient_checkpointing_enable(
                        gradient_checkpointing_kwargs={"use_reentrant": False}
                    )
        return model

    def stepper(self, optimizer: torch.optim.Optimizer) -> Stepper:
        """Backward and optimizer steps for ``optimizer`` in this precision."""
        scaler = None
        if self.precision == "fp16":
            scaler = torch.amp.GradScaler(self.device.type)
        return Stepper(optimizer, scaler)


@dataclass
class Stepper:
    """``backward`` then ``step``: plain for fp32/bf16; with a GradScaler for fp16, whose
    gradients are unscaled before ``step`` (and before any correction added to them), and
    whose overflowing steps are skipped, as ``torch.amp`` prescribes."""

    optimizer: torch.optim.Optimizer
    scaler: Any = None
    _unscaled: bool = field(default=False, repr=False)

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate ``loss`` (scaled for fp16)."""
        if self.scaler is None:
            loss.backward()
        else:
            self.scaler.scale(loss).backward()
            self._unscaled = False

    def unscale(self) -> None:
        """Make ``.grad`` hold true gradients (fp16: divide the scale out, once per step)."""
        if self.scaler is not None and not self._unscaled:
            self.scaler.unscale_(self.optimizer)
            self._unscaled = True

    def step(self) -> None:
        """The optimizer step (fp16: skipped when a gradient overflowed; the scale adapts)."""
        if self.scaler is None:
            self.optimizer.step()
            return
        self.unscale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self._unscaled = False


def _checkpointing(model: Any) -> bool:
    """Whether checkpointing is on (transformers 5 name first; the old one warns)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


def _hf_model(model: nn.Module) -> Any:
    """The Hugging Face model inside ``model`` (itself, or the base under PEFT), if any."""
    for candidate in (getattr(model, "get_base_model", lambda: None)(), model):
        if candidate is not None and hasattr(candidate, "gradient_checkpointing_enable"):
            if getattr(candidate, "supports_gradient_checkpointing", True):
                return candidate
    return None


def model_autocast(model: nn.Module) -> contextlib.AbstractContextManager[Any]:
    """Autocast to the half precision ``model`` was loaded in (nothing for an fp32 model).

    Evaluation and generation take the model as it was loaded, in the job's dtype; a model
    whose trained parts were kept fp32 (:meth:`Runtime.master`) next to bf16 frozen weights
    needs autocast to run at all.
    """
    device = torch.device("cpu")
    for param in model.parameters():
        device = param.device
        if param.dtype in (torch.bfloat16, torch.float16):
            return torch.autocast(device_type=device.type, dtype=param.dtype)
    return contextlib.nullcontext()
