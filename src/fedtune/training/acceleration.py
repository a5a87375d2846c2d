"""Opt-in speed for training forward passes: ``training.compile`` and ``training.kernels``.

- **compile**: the forward passes of training loops (client steps, the provider's
  distillation) run through ``torch.compile`` (inductor). The compiled wrapper shares the
  model's parameters, so state dicts, adapters and what is stored keep their names; it is
  kept per model, so a process compiles once per model (and once more, with dynamic shapes,
  when the batch length first changes). Evaluation and generation stay eager.
- **kernels: liger**: Liger-Kernel's Triton kernels patched into the model instance
  (RMSNorm, RoPE, SwiGLU, fused linear cross-entropy) for the model types it lists.

``FEDTUNE_COMPILE_BACKEND`` (:data:`fedtune.core.devices.BACKEND_ENV`) names another ``torch.compile`` backend (default ``inductor``):
``aot_eager`` traces the same graphs, forward and backward, without generating kernels,
which is how the CPU tests check the compiled path in seconds rather than minutes.

Neither is bitwise equal to the plain path (fused and reordered float arithmetic); the CPU
tests hold ``compile`` to a stated tolerance. What the machine cannot run is refused where
the device is resolved (:func:`fedtune.core.devices.check_acceleration`: ``fedtune validate``,
``run``, each step), a model type Liger lacks when the model is built: a ``ConfigError``
before any training, never a silent fallback.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fedtune.core.devices import compile_backend
from fedtune.core.errors import ConfigError

_COMPILED: weakref.WeakKeyDictionary[nn.Module, Callable[..., Any]] = weakref.WeakKeyDictionary()


def apply_kernels(model: nn.Module, kernels: str) -> None:
    """Patch ``kernels`` into ``model`` (its Hugging Face model, also under PEFT) in place.

    Raises:
        ConfigError: The model's type is not one Liger-Kernel has kernels for.
    """
    if kernels != "liger":
        return
    from liger_kernel.transformers.monkey_patch import (
        MODEL_TYPE_TO_APPLY_LIGER_FN,
        _apply_liger_kernel_to_instance,
    )

    base = getattr(model, "get_base_model", lambda: model)()
    model_type = getattr(getattr(base, "config", None), "model_type", None)
    check_liger_family(model_type, MODEL_TYPE_TO_APPLY_LIGER_FN)
    _apply_liger_kernel_to_instance(model=base)


def check_liger_family(model_type: str | None, supported: Any) -> None:
    """Raise unless Liger-Kernel lists ``model_type`` (its own table, ``supported``).

    Raises:
        ConfigError: An unlisted model type (Liger itself would only log and do nothing).
    """
    if model_type not in supported:
        raise ConfigError(
            f"training.kernels: liger has no kernels for model type {model_type!r} "
            f"(it supports {sorted(supported)})",
            fix="Set training.kernels: none for this model, or use a model family Liger supports.",
        )


def training_forward(model: nn.Module, compile_forward: bool) -> Callable[..., Any]:
    """What a training loop calls for its forward passes: ``model`` itself, or its compiled
    wrapper (one per model and process; it shares the model's parameters)."""
    if not compile_forward:
        return model
    compiled = _COMPILED.get(model)
    if compiled is None:
        compiled = torch.compile(model, backend=compile_backend())
        _COMPILED[model] = compiled
    return compiled
