"""LoRA adapters (Hu et al. 2022) on PEFT: attach, read and write by name, export.

Adapter tensors are addressed everywhere by the names :func:`peft.get_peft_model_state_dict`
gives them (for example ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``):
these are the keys of every update that crosses between tenants and the provider, so reading
and writing them is strict. PEFT's own ``set_peft_model_state_dict`` ignores missing and
unexpected names; :func:`set_adapter_state` checks before it calls it.
"""

from __future__ import annotations

import copy
import json
import logging
import weakref
from pathlib import Path

import torch
from peft import (
    LoraConfig,
    PeftModel,
    get_peft_model,
    get_peft_model_state_dict,
    set_peft_model_state_dict,
)
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from fedtune.core.errors import ModelError
from fedtune.models.loading import save_pretrained_dir
from fedtune.models.tiny import ARCHS

logger = logging.getLogger(__name__)

ADAPTER_NAME = "default"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"

# Attention projections as in the LoRA paper and FedPT's settings. GPT-2 fuses q, k and v into
# one Conv1D (``c_attn``) whose weight is stored transposed, hence fan_in_fan_out.
DEFAULT_TARGETS: dict[str, list[str]] = {"llama": ["q_proj", "v_proj"], "gpt2": ["c_attn"]}
# ``target_modules: [all-linear]``: every linear layer of a decoder block, whatever the
# architecture (a job whose tenants' models differ in architecture, e.g. FedMKT's, can name
# them in one LoRA section). GPT-2's ``c_proj`` is both the attention output and the MLP's.
ALL_LINEAR = "all-linear"
ALL_LINEAR_TARGETS: dict[str, list[str]] = {
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "gpt2": ["c_attn", "c_proj", "c_fc"],
}
_FAN_IN_FAN_OUT = {"llama": False, "gpt2": True}
# Error messages list at most this many names, then a count.
_SHOWN_NAMES = 8


def resolve_targets(target_modules: list[str] | None, arch: str) -> list[str]:
    """The module names LoRA adapts on ``arch``: the given ones, ``all-linear`` spelled out,
    or the architecture's default."""
    if target_modules is None:
        return list(DEFAULT_TARGETS[arch])
    if list(target_modules) == [ALL_LINEAR]:
        return list(ALL_LINEAR_TARGETS[arch])
    return list(target_modules)


def apply_lora(
    model: PreTrainedModel,
    *,
    r: int,
    alpha: float,
    dropout: float,
    target_modules: list[str] | None,
    arch: str,
    seed: int | None = None,
) -> PeftModel:
    """Wrap ``model`` with a fresh LoRA adapter; only the adapter stays trainable.

    PEFT injects the adapter layers into ``model`` itself, so the argument must not be used
    on its own afterwards.

    Args:
        model: A causal LM of architecture ``arch``.
        r: Rank.
        alpha: Scaling numerator (scale = alpha / r).
        dropout: Dropout on the adapter's input.
        target_modules: Module names to adapt; ``None`` for the architecture's default,
            ``["all-linear"]`` for all linear layers of its blocks.
        arch: ``"llama"`` or ``"gpt2"``; must match ``model.config.model_type``.
        seed: Seed of the ``lora_A`` initialisation; ``None`` uses the current RNG.

    Raises:
        ModelError: Unknown or mismatched arch, bad hyperparameters, or a target module name
            that matches no module of the model.
    """
    if arch not in ARCHS:
        raise ModelError(
            f"LoRA arch={arch!r} is not one of {list(ARCHS)}",
            fix="Use a supported architecture, or pass target_modules for another one.",
        )
    model_type = getattr(model.config, "model_type", None)
    if model_type != arch:
        raise ModelError(
            f"LoRA arch={arch!r} does not match the model's model_type={model_type!r}",
            fix="Pass the arch of the model you built or loaded.",
        )
    problems = []
    if r < 1:
        problems.append(f"r={r} must be >= 1")
    if alpha <= 0:
        problems.append(f"alpha={alpha} must be > 0")
    if not 0.0 <= dropout < 1.0:
        problems.append(f"dropout={dropout} must be in [0, 1)")
    if target_modules is not None and not target_modules:
        problems.append("target_modules=[] names no module")
    if problems:
        raise ModelError(
            "invalid LoRA settings: " + "; ".join(problems),
            fix="Correct the lora section of the job file.",
        )
    targets = resolve_targets(target_modules, arch)
    _check_targets(model, targets)
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,  # type: ignore[arg-type]  # PEFT annotates int; floats work
        lora_dropout=dropout,
        target_modules=targets,
        fan_in_fan_out=_FAN_IN_FAN_OUT[arch],
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        peft_model = get_peft_model(model, config, adapter_name=ADAPTER_NAME)
    logger.debug("applied LoRA r=%d alpha=%s to %s on %s", r, alpha, targets, arch)
    return peft_model


def _check_targets(model: nn.Module, targets: list[str]) -> None:
    """Fail with the available names when a target matches no module (PEFT's error is vaguer)."""
    names = [name for name, _ in model.named_modules() if name]
    # PEFT matches a target against a module's full name or a dotted suffix of it.
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    leaf_names = {name.rsplit(".", 1)[-1] for name in names}
    if missing:
        raise ModelError(
            f"LoRA target_modules {missing} match no module of the "
            f"{type(model).__name__}; available: {sorted(leaf_names)}",
            fix="Use module names from the list, or leave target_modules unset for the default.",
        )


def _require_peft(model: object, what: str) -> PeftModel:
    if not isinstance(model, PeftModel):
        raise ModelError(
            f"{what} needs a PEFT model, got {type(model).__name__}",
            fix="Wrap the model with fedtune.models.lora.apply_lora first.",
        )
    return model


def adapter_state(model: PeftModel) -> dict[str, torch.Tensor]:
    """Adapter tensors by name: detached, contiguous CPU copies safe to send or mutate."""
    state = get_peft_model_state_dict(_require_peft(model, "adapter_state"))
    return {name: t.detach().to("cpu", copy=True).contiguous() for name, t in state.items()}


_Structure = tuple[tuple[str, tuple[int, ...]], ...]
# PEFT's state dict reads the whole model (and the base's config.json) on every call; every
# round loads adapter tensors into each party's model, checked against these shapes. Kept
# per model while its tensors' names and shapes stay the same.
_SHAPES: weakref.WeakKeyDictionary[PeftModel, tuple[_Structure, dict[str, tuple[int, ...]]]] = (
    weakref.WeakKeyDictionary()
)


def _structure(model: PeftModel) -> _Structure:
    tensors = [*model.named_parameters(), *model.named_buffers()]
    return tuple((name, tuple(t.shape)) for name, t in tensors)


def adapter_shapes(model: PeftModel) -> dict[str, tuple[int, ...]]:
    """Shape of every adapter tensor, by the names of :func:`adapter_state`."""
    structure = _structure(_require_peft(model, "adapter_shapes"))
    known = _SHAPES.get(model)
    if known is None or known[0] != structure:
        state = get_peft_model_state_dict(model)
        known = structure, {name: tuple(t.shape) for name, t in state.items()}
        _SHAPES[model] = known
    return dict(known[1])


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:_SHOWN_NAMES])
    more = len(names) - _SHOWN_NAMES
    return f"{shown} (+{more} more)" if more > 0 else shown


def set_adapter_state(model: PeftModel, tensors: dict[str, torch.Tensor]) -> None:
    """Load adapter tensors into ``model``; exactly the model's adapter names and shapes.

    Raises:
        ModelError: Names are missing or unexpected, or shapes differ; nothing is loaded then.
    """
    expected = adapter_shapes(_require_peft(model, "set_adapter_state"))
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    wrong = [
        f"{name}: got {tuple(tensors[name].shape)}, expected {expected[name]}"
        for name in sorted(set(expected) & set(tensors))
        if tuple(tensors[name].shape) != expected[name]
    ]
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing: {_names(missing)}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected: {_names(unexpected)}")
        if wrong:
            parts.append(f"{len(wrong)} with wrong shape: {_names(wrong)}")
        raise ModelError(
            "adapter tensors do not fit the model: " + "; ".join(parts),
            fix="Send adapters produced by the same model and LoRA settings (r, targets).",
        )
    if _copy_into_adapter(model, tensors, expected):
        return
    result = set_peft_model_state_dict(model, tensors, adapter_name=ADAPTER_NAME)
    # Checked above, so this only trips if PEFT's naming changes under us.
    unplaced = list(getattr(result, "unexpected_keys", []))
    if unplaced:
        raise ModelError(
            f"PEFT did not place adapter tensors: {_names(unplaced)}",
            fix="Pin peft to the version in pyproject.toml.",
        )


def _copy_into_adapter(
    model: PeftModel, tensors: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]]
) -> bool:
    """Copy ``tensors`` straight into the adapter's parameters, as PEFT's loader ends up doing
    (``copy_`` under no_grad, the same bits), without its walk over the whole model's state
    dict: on a small model that walk was most of a round's adapter loads (issue 33). False,
    with nothing copied, where names or shapes do not line up one to one (left to PEFT)."""
    marker = f".{ADAPTER_NAME}."
    params = {
        name.replace(marker, "."): p for name, p in model.named_parameters() if marker in name
    }
    if set(params) != set(expected) or any(
        tuple(params[name].shape) != shape for name, shape in expected.items()
    ):
        return False
    with torch.no_grad():
        for name, tensor in tensors.items():
            params[name].copy_(tensor)
    return True


def trainable_parameters(model: PeftModel) -> dict[str, nn.Parameter]:
    """The live trainable parameters, keyed by the names of :func:`adapter_state`.

    Raises:
        ModelError: The trainable parameters are not exactly the adapter tensors (for example
            base weights were unfrozen), so names could not be matched one to one.
    """
    expected = adapter_shapes(_require_peft(model, "trainable_parameters"))
    # get_peft_model_state_dict drops the adapter name from each key; do the same.
    marker = f".{ADAPTER_NAME}"
    params = {
        name.replace(marker, ""): p for name, p in model.named_parameters() if p.requires_grad
    }
    if set(params) != set(expected):
        extra = sorted(set(params) - set(expected))
        lacking = sorted(set(expected) - set(params))
        raise ModelError(
            "trainable parameters differ from the adapter tensors: "
            f"trainable but not adapter: {_names(extra) or 'none'}; "
            f"adapter but not trainable: {_names(lacking) or 'none'}",
            fix="Train only the LoRA adapter: do not unfreeze base weights of a PEFT model.",
        )
    return params


def save_adapter(peft_model: PeftModel, out_dir: str | Path) -> Path:
    """Write the adapter in PEFT format (``adapter_config.json`` + safetensors weights)."""
    out = Path(out_dir)
    _require_peft(peft_model, "save_adapter").save_pretrained(
        str(out), safe_serialization=True, save_embedding_layers=False
    )
    # PEFT writes target_modules from a set, in hash-seed order: sort them so the same
    # adapter always has the same bytes (registration is keyed by the export's hash).
    config_path = out / ADAPTER_CONFIG
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
        text = json.dumps(config, indent=2, sort_keys=True) + "\n"
        config_path.write_text(text, encoding="utf-8")
    return out


def load_adapter(
    model: PreTrainedModel, adapter_dir: str | Path, *, trainable: bool = False
) -> PeftModel:
    """Attach an adapter written by :func:`save_adapter` to a base model (safetensors only).

    Like :func:`apply_lora`, this injects the adapter into ``model`` itself.

    Raises:
        ModelError: The directory lacks the adapter config or safetensors weights.
    """
    path = Path(adapter_dir)
    lacking = [n for n in (ADAPTER_CONFIG, ADAPTER_WEIGHTS) if not (path / n).is_file()]
    if lacking:
        found = sorted(p.name for p in path.iterdir()) if path.is_dir() else "no directory"
        raise ModelError(
            f"adapter directory {str(path)!r} lacks {lacking} (found: {found or 'nothing'})",
            fix="Point at a folder written by fedtune.models.lora.save_adapter.",
        )
    peft_model = PeftModel.from_pretrained(
        model, str(path), adapter_name=ADAPTER_NAME, is_trainable=trainable
    )
    peft_model.eval()
    return peft_model


def merge_and_export(
    peft_model: PeftModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path
) -> Path:
    """Write a plain Hugging Face directory with the adapter merged into the base weights.

    Works on a copy, so ``peft_model`` stays usable (at the cost of one model's memory).
    """
    merged = copy.deepcopy(_require_peft(peft_model, "merge_and_export")).merge_and_unload()
    merged.eval()
    return save_pretrained_dir(merged, tokenizer, out_dir)
