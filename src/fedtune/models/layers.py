"""Decoder-layer extraction for offsite tuning, and models assembled from layers by name.

FedBiOT (Wu et al. 2024, Algorithm 2 ``LayerExtract``): of ``n`` decoder layers (indexed from
0), the adapter A is the last ``s``; the non-compressed emulator E* is layers ``0..n-s-1``;
the emulator E keeps ``n' = floor(beta * (n - s))`` of them, ``beta = 1 - dropout``, at
``floor(j * stride)`` with ``stride = (n - s - 1) / (n' - 1)``, ``j = 0..n'-1`` (so the first
and the last layer of E* are kept). Offsite-tuning / FedOT (Xiao et al. 2023; Kuang et al.
2023) take the first two and the last two layers as the adapter and drop layers uniformly
from the middle with the same rule.

Floors are taken in exact rational arithmetic: ``0.8 * 30`` is 24.000000000000004 in floating
point and ``29 / 23 * 23`` is 28.999999999999996, either of which a float floor gets wrong.

A *composite* model is a model of the base architecture whose layers are a chosen sequence of
base layers (AdapEmu: E then A; AdapFu: E* then A). Its weights are mapped from base-model
names by name (``model.layers.{k}.x`` <- ``model.layers.{order[k]}.x``); any name that is
missing, unexpected or of the wrong shape is a :class:`ModelError`, never a positional zip.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from fedtune.core.errors import ConfigError, ModelError

# Where known decoder families keep their layer list (Llama/Mistral/Qwen, GPT-2, GPT-NeoX, OPT).
_KNOWN_PREFIXES = ("model.layers", "transformer.h", "gpt_neox.layers", "model.decoder.layers")
_SHOWN = 6


@dataclass(frozen=True)
class LayerSplit:
    """Which base-model layers form the adapter, E* and the emulator E (base indices)."""

    num_layers: int
    adapter: tuple[int, ...]
    full_emulator: tuple[int, ...]  # E*: stays with the provider
    emulator: tuple[int, ...]  # E: the kept subset of E*, sent to tenants

    @property
    def dropped(self) -> tuple[int, ...]:
        """Layers of E* that the emulator leaves out (never sent)."""
        kept = set(self.emulator)
        return tuple(i for i in self.full_emulator if i not in kept)

    @property
    def emulator_order(self) -> tuple[int, ...]:
        """AdapEmu's layers, in base order: adapter and emulator layers interleaved by index."""
        return tuple(sorted(self.adapter + self.emulator))

    @property
    def full_order(self) -> tuple[int, ...]:
        """AdapFu's layers: every base layer."""
        return tuple(range(self.num_layers))

    def emulator_output_position(self, order: Sequence[int]) -> int:
        """Index into ``hidden_states`` of the output of the last E (or E*) layer in ``order``.

        ``hidden_states[0]`` is the embedding output and ``hidden_states[k + 1]`` the output
        of the k-th layer of the composite (the last entry is after the final norm, which
        never applies here because an adapter layer always follows the emulator).
        """
        members = set(self.emulator) | set(self.full_emulator)
        last = max(k for k, index in enumerate(order) if index in members)
        return last + 1

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (stored in state metadata and broadcasts)."""
        return {
            "num_layers": self.num_layers,
            "adapter": list(self.adapter),
            "full_emulator": list(self.full_emulator),
            "emulator": list(self.emulator),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LayerSplit:
        """Inverse of :meth:`to_json`."""
        return cls(
            num_layers=int(data["num_layers"]),
            adapter=tuple(int(i) for i in data["adapter"]),
            full_emulator=tuple(int(i) for i in data["full_emulator"]),
            emulator=tuple(int(i) for i in data["emulator"]),
        )


def _kept_count(total: int, dropout: float) -> int:
    """``floor(beta * total)`` with beta = 1 - dropout, exactly for the decimal the user wrote."""
    beta = 1 - Fraction(repr(float(dropout)))
    return (beta * total).numerator // (beta * total).denominator


def uniform_keep(total: int, kept: int) -> list[int]:
    """Algorithm 2's indices ``floor(j * (total - 1) / (kept - 1))``, ``j = 0..kept-1``.

    With one kept layer the stride is undefined and ``j = 0`` gives index 0 whatever it is.
    """
    if kept == 1:
        return [0]
    return [(j * (total - 1)) // (kept - 1) for j in range(kept)]


def _check_dropout(dropout: float) -> None:
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(
            f"algorithm.dropout={dropout} is outside [0, 1)",
            fix="Use a layer dropout rate such as 0.2 or 0.5 (0 keeps every layer of E*).",
        )


def layer_extract(num_layers: int, adapter_size: int, dropout: float) -> LayerSplit:
    """FedBiOT's LayerExtract (Algorithm 2): adapter = last ``adapter_size`` layers.

    Raises:
        ConfigError: ``adapter_size`` leaves no E* layer, ``dropout`` is outside [0, 1), or
            the dropout leaves no emulator layer; the message names the field.
    """
    _check_dropout(dropout)
    if not 1 <= adapter_size < num_layers:
        raise ConfigError(
            f"algorithm.adapter_size={adapter_size} must be at least 1 and smaller than the "
            f"model's {num_layers} decoder layers",
            fix=f"Use an adapter_size between 1 and {num_layers - 1} (paper: 2 or 4), or a "
            "model with more layers.",
        )
    rest = num_layers - adapter_size
    kept = _kept_count(rest, dropout)
    if kept < 1:
        raise ConfigError(
            f"algorithm.dropout={dropout} keeps no layer of the {rest}-layer E* "
            f"(floor({1 - dropout:g} * {rest}) = 0)",
            fix="Lower dropout or use a model with more layers.",
        )
    return LayerSplit(
        num_layers=num_layers,
        adapter=tuple(range(rest, num_layers)),
        full_emulator=tuple(range(rest)),
        emulator=tuple(uniform_keep(rest, kept)),
    )


def offsite_split(num_layers: int, dropout: float, edge: int = 2) -> LayerSplit:
    """Offsite-tuning / FedOT: adapter = first ``edge`` + last ``edge`` layers.

    The emulator keeps ``floor(beta * m)`` of the ``m`` middle layers with Algorithm 2's
    uniform rule, offset by ``edge``.

    Raises:
        ConfigError: The model has no middle layer, or the dropout keeps none of them.
    """
    _check_dropout(dropout)
    middle = num_layers - 2 * edge
    if middle < 1:
        raise ConfigError(
            f"model.num_layers={num_layers} leaves no emulator layer between the first "
            f"{edge} and last {edge} adapter layers",
            fix=f"Use a model with at least {2 * edge + 1} decoder layers.",
        )
    kept = _kept_count(middle, dropout)
    if kept < 1:
        raise ConfigError(
            f"algorithm.dropout={dropout} keeps none of the {middle} middle layers",
            fix="Lower dropout or use a model with more layers.",
        )
    return LayerSplit(
        num_layers=num_layers,
        adapter=tuple(range(edge)) + tuple(range(num_layers - edge, num_layers)),
        full_emulator=tuple(range(edge, num_layers - edge)),
        emulator=tuple(edge + i for i in uniform_keep(middle, kept)),
    )


@dataclass(frozen=True)
class LayerLayout:
    """Where a model keeps its decoder layers: ``{prefix}.{index}.{rest}`` parameter names."""

    prefix: str
    num_layers: int

    def parse(self, key: str) -> tuple[int, str] | None:
        """``(layer index, rest of the name)`` of a layer parameter, else None."""
        match = re.fullmatch(re.escape(self.prefix) + r"\.(\d+)\.(.+)", key)
        return (int(match.group(1)), match.group(2)) if match else None

    def key(self, index: int, rest: str) -> str:
        """The parameter name of ``rest`` in layer ``index``."""
        return f"{self.prefix}.{index}.{rest}"

    def layer_names(self, names: Sequence[str], layers: Sequence[int]) -> list[str]:
        """The names among ``names`` that belong to one of ``layers``."""
        wanted = set(layers)
        return [n for n in names if (p := self.parse(n)) is not None and p[0] in wanted]

    def to_json(self) -> dict[str, Any]:
        """Plain JSON."""
        return {"prefix": self.prefix, "num_layers": self.num_layers}


def locate_layers(model: nn.Module) -> LayerLayout:
    """Find the decoder-layer list of a causal LM (Llama- or GPT-2-shaped, and kin).

    Raises:
        ModelError: No ``ModuleList`` of ``config.num_hidden_layers`` layers is found at a
            known place or anywhere else.
    """
    config = getattr(model, "config", None)
    count = getattr(config, "num_hidden_layers", None)
    candidates: list[str] = []
    for prefix in _KNOWN_PREFIXES:
        try:
            module = model.get_submodule(prefix)
        except AttributeError:
            continue
        if isinstance(module, nn.ModuleList) and (count is None or len(module) == count):
            return LayerLayout(prefix=prefix, num_layers=len(module))
    if count is not None:
        candidates = [
            name
            for name, module in model.named_modules()
            if isinstance(module, nn.ModuleList) and len(module) == count and name
        ]
    if len(candidates) == 1:
        return LayerLayout(prefix=candidates[0], num_layers=int(count or 0))
    model_type = getattr(config, "model_type", None)
    raise ModelError(
        f"cannot locate the decoder layers of the model ({type(model).__name__}, "
        f"model_type={model_type!r}, num_hidden_layers={count!r}): none of {list(_KNOWN_PREFIXES)} "
        f"holds them and {len(candidates)} other module list(s) of that length exist",
        fix="Set model (source/arch or uri) to a Llama- or GPT-2-shaped causal LM whose config "
        "states num_hidden_layers.",
    )


def unique_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict without aliases: a tied LM head appears once, as its embedding.

    safetensors refuses tensors that share memory, and the alias carries no information.
    """
    seen: set[tuple[int, tuple[int, ...]]] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        ident = (tensor.data_ptr(), tuple(tensor.shape))
        if tensor.numel() and ident in seen:
            continue
        seen.add(ident)
        out[name] = tensor
    return out


def composite_config(config: PretrainedConfig, num_layers: int) -> PretrainedConfig:
    """A copy of ``config`` with ``num_layers`` decoder layers."""
    out = copy.deepcopy(config)
    out.num_hidden_layers = num_layers
    layer_types = getattr(out, "layer_types", None)
    if isinstance(layer_types, list) and layer_types:
        if len(set(layer_types)) > 1:
            raise ModelError(
                f"the model mixes decoder layer types {sorted(set(layer_types))}, which a "
                "layer-dropped emulator cannot keep consistent",
                fix="Use a model whose decoder layers are all of one type (Llama, GPT-2).",
            )
        out.layer_types = layer_types[:1] * num_layers
    return out


def map_to_composite(
    layout: LayerLayout, order: Sequence[int], source: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Rename base-model tensors to a composite of layers ``order``: layer ``order[k]`` -> k.

    Non-layer tensors keep their names; layers not in ``order`` are left out.
    """
    position = {index: k for k, index in enumerate(order)}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in source.items():
        parsed = layout.parse(name)
        if parsed is None:
            out[name] = tensor
        elif parsed[0] in position:
            out[layout.key(position[parsed[0]], parsed[1])] = tensor
    return out


def map_to_base(
    layout: LayerLayout, order: Sequence[int], tensors: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Inverse of :func:`map_to_composite`: composite layer k -> base layer ``order[k]``."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        parsed = layout.parse(name)
        out[name if parsed is None else layout.key(order[parsed[0]], parsed[1])] = tensor
    return out


def _listed(names: Sequence[str]) -> str:
    names = sorted(names)
    more = len(names) - _SHOWN
    return ", ".join(names[:_SHOWN]) + (f" (+{more} more)" if more > 0 else "")


def load_by_name(model: nn.Module, tensors: Mapping[str, torch.Tensor], *, what: str) -> None:
    """Copy ``tensors`` into ``model``: exactly its (alias-free) names and shapes.

    Raises:
        ModelError: Names are missing or unexpected or shapes differ; nothing is loaded then.
    """
    expected = {k: tuple(v.shape) for k, v in unique_state(model).items()}
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    wrong = [
        f"{k}: got {tuple(tensors[k].shape)}, expected {expected[k]}"
        for k in sorted(set(expected) & set(tensors))
        if tuple(tensors[k].shape) != expected[k]
    ]
    if missing or unexpected or wrong:
        parts = [
            f"{len(items)} {label}: {_listed(items)}"
            for label, items in (
                ("missing", missing),
                ("unexpected", unexpected),
                ("wrong shape", wrong),
            )
            if items
        ]
        raise ModelError(
            f"{what}: tensors do not match the model by name: " + "; ".join(parts),
            fix="Build the tensors from the same base model and layer split (keys are mapped "
            "by name, never by position).",
        )
    with torch.no_grad():
        state = model.state_dict()
        for name, tensor in tensors.items():
            state[name].copy_(tensor)


def build_composite(
    config: PretrainedConfig,
    layout: LayerLayout,
    order: Sequence[int],
    source: Mapping[str, torch.Tensor],
    *,
    what: str,
    dtype: torch.dtype = torch.float32,
) -> PreTrainedModel:
    """A model of ``config``'s architecture whose layers are base layers ``order``.

    Args:
        config: The base model's config.
        layout: Where the base model keeps its layers.
        order: Base layer indices, in the order the composite runs them.
        source: Base-named tensors: every non-layer tensor and every layer of ``order``
            (extra layers are ignored).
        what: Name used in errors ("AdapEmu", "AdapFu").
        dtype: Dtype the model is built in (``source`` is cast to it).

    Raises:
        ModelError: A tensor is missing, unexpected or of the wrong shape.
    """
    wanted = {k: v for k, v in source.items() if (p := layout.parse(k)) is None or p[0] in order}
    # Seeded and RNG-isolated: the random init is overwritten, but must not shift the
    # caller's random stream (dropout seeds, batch order).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model: PreTrainedModel = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            composite_config(config, len(order)), dtype=dtype
        )
    load_by_name(model, map_to_composite(layout, order, wanted), what=what)
    for param in model.parameters():
        param.requires_grad_(False)
    model.eval()  # type: ignore[no-untyped-call]
    return model
