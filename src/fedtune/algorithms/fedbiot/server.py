"""The provider's half: split, pre-distil, package each round, aggregate, realign, export.

Round order (as the reference, with its mistakes fixed): aggregate the adapters (FedAvg,
sample-weighted) -> realign the emulator for ``align_steps`` (Eq. 2, public data only) ->
evaluate on schedule -> next round's broadcast carries the adapter *and* the emulator delta.
Before round 1 the emulator is pre-distilled for ``pre_distill_steps``; FedBiOT then also runs
Algorithm 1's first ``align_steps`` (lines 3-6 at t = 0) right away.

Nothing of E* beyond the emulator's kept layers is ever written to the exchange store: the
state holds the adapter, the emulator and the tenants' view of it; E* comes from the
provider's model in every phase; AdapFu is exported to the provider's work directory only
(tagged ``provider_only``, which the engine does not copy into the exchange store).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PretrainedConfig

from fedtune.aggregation import client_weights, weighted_mean
from fedtune.algorithms.base import Artifact
from fedtune.algorithms.fedbiot import transport
from fedtune.algorithms.fedbiot.alignment import (
    AlignPlan,
    Pair,
    align,
    measure,
    public_batches,
)
from fedtune.algorithms.fedbiot.config import OffsiteFamilyConfig
from fedtune.algorithms.fedbiot.package import Blueprint, Tensors, select
from fedtune.core.messages import Broadcast, ServerState, Update, prefixed
from fedtune.core.tags import PROVIDER_ONLY_TAG
from fedtune.eval.loss import lm_eval_loss
from fedtune.models import lora as lora_helpers
from fedtune.models.layers import (
    LayerSplit,
    locate_layers,
    map_to_base,
    map_to_composite,
    unique_state,
)
from fedtune.models.loading import save_pretrained_dir
from fedtune.training.context import (
    ProviderContext,
    derive_seed,
    split_examples,
    tokenizer_to_tensors,
)

log = logging.getLogger(__name__)

Encoded = dict[str, list[int]]


@dataclass
class Provider:
    """What the provider's phases share: config, blueprint and the base model's tensors."""

    config: OffsiteFamilyConfig
    ctx: ProviderContext
    blueprint: Blueprint
    base: Tensors  # alias-free base state, base names (E* lives only here)
    _public: tuple[list[Encoded], list[Encoded]] | None = field(default=None, repr=False)

    @classmethod
    def create(
        cls, config: OffsiteFamilyConfig, ctx: ProviderContext, split: LayerSplit
    ) -> Provider:
        """Locate the layers of the provider's model and bind the split to it."""
        model = ctx.base_model()
        layout = locate_layers(model)
        model_config: PretrainedConfig = model.config
        blueprint = Blueprint(
            config=model_config, layout=layout, split=split, arch=ctx.arch, runtime=ctx.runtime
        )
        return cls(config=config, ctx=ctx, blueprint=blueprint, base=unique_state(model))

    @property
    def lora_mode(self) -> bool:
        """Tenants train LoRA tensors on the adapter layers instead of their weights."""
        return self.config.adapter_training == "lora"

    def names(self, group: str) -> list[str]:
        """Base names of a layer group (adapter, emulator, full_emulator, dropped)."""
        return self.blueprint.group_names(list(self.base), group)

    def frozen(self) -> Tensors:
        """Tensors tenants receive once: embeddings, norms, head (+ adapter base in LoRA mode)."""
        names = self.blueprint.non_layer_names(list(self.base))
        if self.lora_mode:
            names += self.names("adapter")
        return select(self.base, names)

    def tokenizer_files(self) -> Tensors:
        """The tokenizer's files as uint8 tensors: tenants get the tokenizer in the package."""
        return tokenizer_to_tensors(self.ctx.tokenizer())

    def initial_adapter(self) -> Tensors:
        """The trainable adapter before round 1: the base layers, or a fresh seeded LoRA."""
        if not self.lora_mode:  # trained weights, so fp32 whatever the model's dtype
            return {k: v.float() for k, v in select(self.base, self.names("adapter")).items()}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.ctx.seed, "lora-init"))
            model = self.blueprint.adapemu(self.base)
            peft = lora_helpers.apply_lora(
                model,
                r=self.ctx.lora_config.r,
                alpha=self.ctx.lora_config.alpha,
                dropout=self.ctx.lora_config.dropout,
                target_modules=self.blueprint.lora_targets(model, self.ctx.lora_config),
                arch=self.blueprint.arch,
            )
        return lora_helpers.adapter_state(peft)

    def effective_adapter(self, adapter: Mapping[str, torch.Tensor]) -> Tensors:
        """Adapter-layer weights by base name (LoRA merged into them in LoRA mode)."""
        if not self.lora_mode:
            return dict(adapter)
        return self.blueprint.merged_adapter(self.base, self.ctx.lora_config, adapter)

    def adapemu(self, emulator: Tensors, adapter: Tensors) -> Any:
        """E + A with the provider's emulator (exact, not the tenants' rounded view)."""
        return self.blueprint.adapemu({**self.base, **emulator, **self.effective_adapter(adapter)})

    def adapfu(self, adapter: Tensors) -> Any:
        """E* + A."""
        return self.blueprint.adapfu({**self.base, **self.effective_adapter(adapter)})

    def pair(self, emulator: Tensors, adapter: Tensors) -> Pair:
        """Student (E + A) and teacher (E* + A) for alignment and its metrics."""
        split = self.blueprint.split
        return Pair(
            student=self.adapemu(emulator, adapter),
            teacher=self.adapfu(adapter),
            student_position=split.emulator_output_position(split.emulator_order),
            teacher_position=split.emulator_output_position(split.full_order),
        )

    # -- public data ----------------------------------------------------------------------
    def public(self) -> tuple[list[Encoded], list[Encoded]]:
        """Encoded public examples: (alignment split, held-out split), seeded, read once."""
        if self._public is None:
            examples = self.ctx.public_examples()
            parts = split_examples(
                examples, self.config.public_eval_fraction, self.ctx.seed, "public"
            )
            held = self.ctx.encode(parts.eval) if parts.eval else []
            self._public = (self.ctx.encode(parts.train), held)
        return self._public

    def plan(self, steps: int) -> AlignPlan:
        """The alignment plan of a phase of ``steps`` steps."""
        ds_config = None
        section = self.config.deepspeed
        if section is not None:
            from fedtune.training.deepspeed import build_config, load_config_file

            base = load_config_file(section.config_path) if section.config_path else None
            ds_config = build_config(
                micro_batch_size=self.config.align_batch_size,
                zero_stage=section.zero_stage,
                bf16=section.bf16,
                base=base,
            )
        return AlignPlan(
            steps=steps,
            lr=self.config.align_lr,
            optimizer=self.config.align_optimizer,
            kl_lambda=self.config.kl_lambda,
            normalize_l2=self.config.normalize_l2,
            deepspeed=ds_config,
            runtime=self.ctx.runtime,
        )

    def align(
        self, emulator: Tensors, adapter: Tensors, steps: int, tag: object
    ) -> tuple[Tensors, dict[str, float]]:
        """``steps`` Eq. 2 steps on public data; the new emulator (base names) and loss means."""
        if steps == 0:
            return emulator, {}
        train, _ = self.public()
        seed = derive_seed(self.ctx.seed, "align", tag)
        pad_id = self.ctx.tokenizer().pad_token_id
        pair = self.pair(emulator, adapter)
        order = self.blueprint.split.emulator_order
        trainable = list(map_to_composite(self.blueprint.layout, order, emulator))
        batches = public_batches(train, self.config.align_batch_size, steps, seed, pad_id)
        trained, means = align(pair, trainable, batches, self.plan(steps), seed=seed)
        aligned = map_to_base(self.blueprint.layout, order, trained)
        # Stored in the dtype the emulator has (the model's: bf16 at 7B halves the state),
        # not the float32 the alignment computes in; a no-op for float32 models.
        return {k: v.to(emulator[k].dtype) if k in emulator else v for k, v in aligned.items()}, means

    def metrics(self, emulator: Tensors, adapter: Tensors) -> dict[str, float]:
        """Provider-side evaluation on held-out public data: Eq. 2 terms, AdapEmu, AdapFu."""
        _, held = self.public()
        if not held:
            return {}
        pair = self.pair(emulator, adapter)
        terms = measure(pair, self.ctx.eval_batches(held), normalize_l2=self.config.normalize_l2)
        return {
            "align/l2": terms["l2"],
            "align/kl": terms["kl"],
            "adapemu/public_loss": lm_eval_loss(pair.student, self.ctx.eval_batches(held)),
            "adapfu/public_loss": lm_eval_loss(pair.teacher, self.ctx.eval_batches(held)),
        }


def run_info(split: LayerSplit) -> dict[str, Any]:
    """Facts of the run recorded at top level of the summary and as MLflow params."""
    return {
        "emulator_layers": list(split.emulator),
        "adapter_layers": list(split.adapter),
        "full_emulator_layers": list(split.full_emulator),
        "dropped_layers": list(split.dropped),
    }


def initial_state(provider: Provider, align_steps: int) -> ServerState:
    """Pre-distil the emulator (and run round 0's alignment) and write the first state."""
    adapter = provider.initial_adapter()
    emulator = select(provider.base, provider.names("emulator"))
    before = provider.metrics(emulator, adapter)
    steps = provider.config.pre_distill_steps + align_steps
    emulator, means = provider.align(emulator, adapter, steps, "pre-distill")
    after = provider.metrics(emulator, adapter)
    # Eq. 2 terms on held-out public data before and after, and their means while training.
    metrics = {
        f"pre_distill/{k[6:]}_before": v for k, v in before.items() if k.startswith("align/")
    }
    metrics.update(
        {f"pre_distill/{k[6:]}_after": v for k, v in after.items() if k.startswith("align/")}
    )
    metrics.update({f"pre_distill/train_{k}": v for k, v in means.items()})
    log.info("pre-distilled the emulator for %d step(s): %s", steps, metrics)
    return ServerState(
        tensors={**prefixed("adapter", adapter), **prefixed("emulator", emulator)},
        meta={
            "round": 0,
            "blueprint": provider.blueprint.to_json(),
            "holders": {},
            "view_version": None,
            "run_info": run_info(provider.blueprint.split),
            "metrics": metrics,
        },
    )


def broadcast(provider: Provider, state: ServerState, round_index: int) -> Broadcast:
    """Adapter, emulator delta against the tenants' copy, and the full package if needed."""
    dtype = transport.DTYPES[provider.config.delta_dtype]
    latest = state.meta.get("view_version")
    view, delta = transport.next_view(state.group("emulator"), state.group("view") or None, dtype)
    full_needed = transport.needs_full(state.meta["holders"], latest, provider.ctx.num_tenants)
    adapter = state.group("adapter")
    tensors = prefixed("adapter", adapter)
    if latest is not None:
        tensors.update(prefixed("delta", delta))
    full: Tensors = {}
    tokenizer: Tensors = {}
    if full_needed:
        full = {**provider.frozen(), **view}
        tokenizer = provider.tokenizer_files()
        tensors.update(prefixed("full", full))
        tensors.update(prefixed("tokenizer", tokenizer))
    return Broadcast(
        tensors=tensors,
        meta={
            "round": round_index,
            "package_version": round_index,
            "delta_base": latest,
            "has_full": full_needed,
            "delta_dtype": provider.config.delta_dtype,
            "blueprint": provider.blueprint.to_json(),
            "raw_bytes": {
                "adapter": transport.nbytes(adapter),
                "delta": transport.nbytes(delta) if latest is not None else 0,
                "full": transport.nbytes(full),
                "tokenizer": transport.nbytes(tokenizer),
            },
        },
    )


def final_broadcast(provider: Provider, state: ServerState) -> Broadcast:
    """What tenants evaluate after the last round: the full package with the exact emulator.

    Self-contained (a fresh tenant pod holds nothing): frozen tensors, the final emulator,
    the adapter and the tokenizer files. No bookkeeping of the server state (holders, the
    tenants' rounded view) is included.
    """
    full = {**provider.frozen(), **state.group("emulator")}
    return Broadcast(
        tensors={
            **prefixed("adapter", state.group("adapter")),
            **prefixed("full", full),
            **prefixed("tokenizer", provider.tokenizer_files()),
        },
        meta={
            "round": int(state.meta.get("round", 0)) + 1,
            "final": True,
            "has_full": True,
            "blueprint": provider.blueprint.to_json(),
        },
    )


def mean_adapter(provider: Provider, updates: dict[str, Update]) -> dict[str, torch.Tensor]:
    """FedAvg of the tenants' adapters (weighted as ``aggregation_weights`` says)."""
    names = sorted(updates)
    counts = [int(updates[n].meta["num_samples"]) for n in names]
    return weighted_mean(
        [updates[n].group("adapter") for n in names],
        client_weights(provider.config.aggregation_weights, counts),
    )


def next_state(
    provider: Provider,
    state: ServerState,
    adapter: dict[str, torch.Tensor],
    metas: dict[str, dict[str, Any]],
    round_index: int,
    align_steps: int,
) -> ServerState:
    """From the averaged adapter and each contributor's metadata: record who holds which
    view, realign, evaluate on schedule."""
    holders = dict(state.meta["holders"])
    for name in sorted(metas):
        if metas[name].get("package_version") == round_index:
            holders[name] = round_index
        else:  # trained on something else: it gets the full package next time
            holders.pop(name, None)
    dtype = transport.DTYPES[provider.config.delta_dtype]
    # The very view this round's broadcast produced (same inputs, same float ops).
    view, _ = transport.next_view(state.group("emulator"), state.group("view") or None, dtype)
    emulator, means = provider.align(state.group("emulator"), adapter, align_steps, round_index)
    metrics = {f"align/train_{k}": v for k, v in means.items()}
    if round_index % provider.config.eval_every == 0:
        metrics.update(provider.metrics(emulator, adapter))
    return ServerState(
        tensors={
            **prefixed("adapter", adapter),
            **prefixed("emulator", emulator),
            **prefixed("view", view),
        },
        meta={
            **{k: v for k, v in state.meta.items() if k != "metrics"},
            "round": round_index,
            "holders": holders,
            "view_version": round_index,
            "metrics": metrics,
        },
    )


def export(
    provider: Provider, state: ServerState, out_dir: Path, tags: dict[str, str]
) -> dict[str, Artifact]:
    """AdapEmu and AdapFu as Hugging Face directories (AdapFu never leaves the provider)."""
    adapter = state.group("adapter")
    split = provider.blueprint.split
    layers = run_info(split)
    out: dict[str, Artifact] = {}
    for kind, model, layer_list in (
        ("adapemu", provider.adapemu(state.group("emulator"), adapter), split.emulator_order),
        ("adapfu", provider.adapfu(adapter), split.full_order),
    ):
        path = save_pretrained_dir(model, provider.ctx.tokenizer(), out_dir / kind)
        # Which base layer each exported layer is: AdapEmu's layer k is base layer order[k].
        (path / "fedtune_layers.json").write_text(
            json.dumps({"model": kind, "base_layers": list(layer_list), **layers}, indent=2),
            encoding="utf-8",
        )
        kind_tags = {**tags, "model": kind}
        if kind == "adapfu":
            kind_tags[PROVIDER_ONLY_TAG] = "true"
        out[kind] = Artifact(kind=kind, path=path, register=True, tags=kind_tags)
    return out
