"""Config-independent pieces of the offsite-tuning family: the model blueprint and packages.

The *blueprint* is what both sides agree on: the base architecture's config, where its
layers live, and the layer split. The provider derives it from its model; a tenant rebuilds
it from broadcast metadata alone (JSON), so a tenant never needs the provider's model.

Tensor groups, all named by the base model's parameter names:

- ``frozen``: embeddings, final norm, LM head (and, with LoRA adapters, the adapter layers'
  base weights) — sent once, never change;
- ``emulator``: the kept layers of E* (trained by the provider's alignment only);
- ``adapter``: what tenants train — the adapter layers' weights, or LoRA tensors on them.

E* layers the emulator dropped belong to no group a tenant receives.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from peft import PeftModel
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel

from fedtune.config.job import LoraConfig
from fedtune.core.errors import ModelError
from fedtune.models import lora as lora_helpers
from fedtune.models.layers import (
    LayerLayout,
    LayerSplit,
    build_composite,
    map_to_base,
    unique_state,
)
from fedtune.training.precision import Runtime

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Blueprint:
    """Base architecture, layer layout and split: everything needed to assemble E+A or E*+A."""

    config: PretrainedConfig
    layout: LayerLayout
    split: LayerSplit
    arch: str  # "llama" or "gpt2": decides LoRA target defaults
    #: Dtype and device the composites are built in and on (the job's; not serialized).
    runtime: Runtime = field(default_factory=Runtime, compare=False)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON for state and broadcast metadata."""
        return {
            "config": json.loads(self.config.to_json_string(use_diff=False)),
            "layout": self.layout.to_json(),
            "split": self.split.to_json(),
            "arch": self.arch,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], runtime: Runtime | None = None) -> Blueprint:
        """Rebuild from :meth:`to_json` (a tenant does this from the broadcast), to build
        composites with ``runtime`` (default: fp32 on the CPU)."""
        config = dict(data["config"])
        model_type = config.pop("model_type")
        layout = data["layout"]
        return cls(
            config=AutoConfig.for_model(model_type, **config),
            layout=LayerLayout(prefix=str(layout["prefix"]), num_layers=int(layout["num_layers"])),
            split=LayerSplit.from_json(data["split"]),
            arch=str(data["arch"]),
            runtime=runtime or Runtime(),
        )

    # -- names ----------------------------------------------------------------------------
    def non_layer_names(self, names: Sequence[str]) -> list[str]:
        """Embeddings, norms and head: names outside the layer list."""
        return [n for n in names if self.layout.parse(n) is None]

    def group_names(self, names: Sequence[str], group: str) -> list[str]:
        """Names of the layers of ``group``: adapter, emulator, full_emulator or dropped."""
        layers = {
            "adapter": self.split.adapter,
            "emulator": self.split.emulator,
            "full_emulator": self.split.full_emulator,
            "dropped": self.split.dropped,
        }[group]
        return self.layout.layer_names(names, layers)

    def lora_targets(self, model: torch.nn.Module, lora: LoraConfig) -> list[str]:
        """Full module names of the LoRA targets inside AdapEmu's adapter layers only."""
        leaves = set(lora_helpers.resolve_targets(lora.target_modules, self.arch))
        order = self.split.emulator_order
        adapter_positions = {k for k, index in enumerate(order) if index in self.split.adapter}
        found = []
        for name, _ in model.named_modules():
            parsed = self.layout.parse(name)
            if parsed and parsed[0] in adapter_positions and name.rsplit(".", 1)[-1] in leaves:
                found.append(name)
        if not found:
            raise ModelError(
                f"LoRA target_modules {sorted(leaves)} match no module of the adapter layers",
                fix="Set lora.target_modules to module names of a decoder layer (Llama: "
                "q_proj, v_proj; GPT-2: c_attn).",
            )
        return found

    # -- assembling models ------------------------------------------------------------------
    def adapemu(self, source: Mapping[str, torch.Tensor]) -> PreTrainedModel:
        """E + A: frozen tensors, emulator layers and full adapter-layer weights, by name."""
        return self._placed(build_composite(
            self.config, self.layout, self.split.emulator_order, source, what="AdapEmu",
            dtype=self.runtime.dtype,
        ))

    def adapfu(self, source: Mapping[str, torch.Tensor]) -> PreTrainedModel:
        """E* + A: every base layer, with the adapter layers taken from ``source``."""
        return self._placed(build_composite(
            self.config, self.layout, self.split.full_order, source, what="AdapFu",
            dtype=self.runtime.dtype,
        ))

    def _placed(self, model: PreTrainedModel) -> PreTrainedModel:
        self.runtime.place(model)
        self.runtime.prepare(model)
        return model

    def with_lora(
        self, model: PreTrainedModel, lora: LoraConfig, adapter: Mapping[str, torch.Tensor] | None
    ) -> PeftModel:
        """Attach LoRA to AdapEmu's adapter layers; load ``adapter`` or initialise fresh."""
        peft_model = lora_helpers.apply_lora(
            model,
            r=lora.r,
            alpha=lora.alpha,
            dropout=lora.dropout,
            target_modules=self.lora_targets(model, lora),
            arch=self.arch,
            seed=0,
        )
        if adapter is not None:
            lora_helpers.set_adapter_state(peft_model, dict(adapter))
        return peft_model

    def merged_adapter(
        self,
        source: Mapping[str, torch.Tensor],
        lora: LoraConfig,
        adapter: Mapping[str, torch.Tensor],
    ) -> Tensors:
        """Adapter-layer weights with the LoRA tensors merged in, by base name."""
        merged = self.with_lora(self.adapemu(source), lora, adapter).merge_and_unload()
        base_named = map_to_base(self.layout, self.split.emulator_order, unique_state(merged))
        wanted = set(self.group_names(list(base_named), "adapter"))
        return {k: v.detach().clone() for k, v in base_named.items() if k in wanted}


def select(tensors: Mapping[str, torch.Tensor], names: Sequence[str]) -> Tensors:
    """Detached, contiguous copies of ``names`` (safe to store or send)."""
    return {n: tensors[n].detach().to("cpu", copy=True).contiguous() for n in names}
