"""The tenant's half: rebuild E + A from the broadcast, evaluate AdapEmu, train the adapter.

A tenant holds no copy of the provider's model. It keeps, in its own store, the package it
was sent (frozen tensors and its copy of the emulator, with the version) and updates it from
each broadcast: a delta when its copy is the latest, else the full package. It trains only
the adapter, with FedBiOT's proximal term ``(eps/2) * ||w_A - w_A^(t)||^2`` (Eq. 1,
Algorithm 1 line 11; eps = 0 for FedOT and Offsite-tuning).

Evaluation on the tenant is of AdapEmu only (E + A), on the tenant's held-out split: loss,
and GSM8K exact match with the paper's few-shot prompt when the data is GSM8K-shaped.
AdapFu needs E*, which never leaves the provider (see the package docstring).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fedtune.algorithms.fedbiot import transport
from fedtune.algorithms.fedbiot.config import OffsiteFamilyConfig
from fedtune.algorithms.fedbiot.package import Blueprint, Tensors
from fedtune.config.job import LoraConfig
from fedtune.core.errors import ModelError
from fedtune.core.messages import Broadcast, ClientState, Update, prefixed
from fedtune.data.formats import Example
from fedtune.data.templates import gsm8k_few_shot_prompt
from fedtune.eval.generation import generate_greedy
from fedtune.eval.gsm8k import exact_match
from fedtune.eval.loss import lm_eval_loss
from fedtune.models import lora as lora_helpers
from fedtune.training.context import TenantContext, TenantData, derive_seed
from fedtune.training.local import plan_steps, proximal_term, train_local

log = logging.getLogger(__name__)

_GSM8K_ANSWER = re.compile(r"The answer is [^\n]*\d[^\n]*$")


def receive(broadcast: Broadcast, kept: ClientState | None) -> tuple[Tensors, int, str]:
    """The tenant's package after this broadcast, the bytes it needed, and how it got it.

    Raises:
        ModelError: The broadcast offers neither a delta against the tenant's copy nor the
            full package.
    """
    meta = broadcast.meta
    base = meta.get("delta_base")
    delta = broadcast.group("delta")
    if kept is not None and base is not None and int(kept.meta["version"]) == int(base):
        package = transport.apply_delta(kept.group("package"), delta)
        return package, transport.nbytes(delta), "delta"
    full = broadcast.group("full")
    if meta.get("has_full"):
        return dict(full), transport.nbytes(full), "full"
    held = None if kept is None else kept.meta.get("version")
    raise ModelError(
        f"round {meta.get('round')}: this tenant holds emulator version {held}, the broadcast "
        f"offers a delta against version {base} and no full copy",
        fix="Delete the tenant's client-state/ folder and resume: the provider then sends the "
        "full emulator.",
    )


def adapemu(
    blueprint: Blueprint,
    package: Mapping[str, torch.Tensor],
    adapter: Mapping[str, torch.Tensor],
    lora: LoraConfig,
    lora_mode: bool,
) -> Any:
    """E + A from the package and the adapter (LoRA-wrapped in LoRA mode)."""
    if lora_mode:
        return blueprint.with_lora(blueprint.adapemu(package), lora, adapter)
    return blueprint.adapemu({**package, **adapter})


def _is_gsm8k(examples: Sequence[Example]) -> bool:
    return bool(examples) and all(_GSM8K_ANSWER.search(ex.response.strip()) for ex in examples)


def _max_positions(model: Any) -> int | None:
    config = getattr(model, "config", None)
    return getattr(config, "max_position_embeddings", None)


def gsm8k_exact_match(
    model: Any, tokenizer: Any, examples: Sequence[Example], config: OffsiteFamilyConfig
) -> float | None:
    """Greedy exact match with the paper's few-shot prompt, or None if prompts do not fit."""
    chosen = list(examples)[: config.max_generation_examples]
    prompts = [gsm8k_few_shot_prompt(ex.instruction, config.gsm8k_shots) for ex in chosen]
    longest = max(len(tokenizer(p)["input_ids"]) for p in prompts)
    limit = _max_positions(model)
    if limit is not None and longest + config.max_new_tokens > limit:
        log.warning(
            "GSM8K exact match skipped: a %d-token prompt plus %d new tokens exceeds the "
            "model's %d positions (lower gsm8k_shots or max_new_tokens)",
            longest,
            config.max_new_tokens,
            limit,
        )
        return None
    generated = generate_greedy(model, tokenizer, prompts, config.max_new_tokens)
    hits = sum(exact_match(g, ex.response) for g, ex in zip(generated, chosen, strict=True))
    return hits / len(chosen)


def evaluate_adapemu(
    ctx: TenantContext, model: Any, data: TenantData, config: OffsiteFamilyConfig
) -> dict[str, float]:
    """AdapEmu's held-out loss (and GSM8K exact match when it applies) on a tenant's split."""
    if not data.eval:
        return {}
    metrics = {"adapemu/eval_loss": lm_eval_loss(model, ctx.eval_batches(ctx.encode(data.eval)))}
    wants = config.exact_match == "gsm8k" or (config.exact_match == "auto" and _is_gsm8k(data.eval))
    if wants:
        score = gsm8k_exact_match(model, ctx.tokenizer(), data.eval, config)
        if score is not None:
            metrics["adapemu/exact_match"] = score
    return metrics


def client_step(
    config: OffsiteFamilyConfig,
    eps: float,
    ctx: TenantContext,
    broadcast: Broadcast,
    data: TenantData,
    kept: ClientState | None,
) -> tuple[Update, ClientState]:
    """Receive the package, evaluate AdapEmu on schedule, train the adapter, report."""
    round_index = int(broadcast.meta["round"])
    blueprint = Blueprint.from_json(broadcast.meta["blueprint"], ctx.runtime)
    package, received, how = receive(broadcast, kept)
    tokenizer = broadcast.group("tokenizer") or ({} if kept is None else kept.group("tokenizer"))
    if not tokenizer:
        raise ModelError(
            f"round {round_index}: neither the broadcast nor the tenant's kept package carries "
            "the tokenizer",
            fix="Delete the tenant's client-state/ folder and resume: the provider then sends "
            "the full package with its tokenizer.",
        )
    ctx.adopt_tokenizer(tokenizer)
    if how == "full":
        received += transport.nbytes(broadcast.group("tokenizer"))
    global_adapter = broadcast.group("adapter")
    lora_mode = config.adapter_training == "lora"
    model = adapemu(blueprint, package, global_adapter, ctx.lora_config, lora_mode)

    metrics: dict[str, float] = {}
    eval_started = time.perf_counter()
    if round_index % config.eval_every == 0:
        metrics.update(evaluate_adapemu(ctx, model, data, config))
    eval_seconds = time.perf_counter() - eval_started

    if lora_mode:
        params = lora_helpers.trainable_parameters(model)
    else:
        adapter_names = set(global_adapter)
        params = {n: p for n, p in _base_named_parameters(blueprint, model) if n in adapter_names}
        for param in params.values():
            param.requires_grad_(True)
    anchor = {k: v.detach().clone() for k, v in global_adapter.items()}
    encoded = ctx.encode(data.train)
    steps = plan_steps(ctx.training, len(encoded))
    seed = derive_seed(ctx.seed, "train", round_index, data.tenant)
    result = train_local(
        model,
        params,
        ctx.train_batches(encoded, steps, seed),
        ctx.training,
        seed=seed,
        regularizer=proximal_term(anchor, eps) if eps > 0 else None,
    )
    if lora_mode:
        trained = lora_helpers.adapter_state(model)
    else:
        trained = {n: p.detach().to("cpu", copy=True).contiguous() for n, p in params.items()}
    metrics["bytes_down"] = float(received + transport.nbytes(global_adapter))
    metrics["bytes_up"] = float(transport.nbytes(trained))
    update = Update(
        tensors=prefixed("adapter", trained),
        meta={
            "num_samples": len(encoded),
            "train_loss": result.loss,
            # None when this round is not an evaluation round (JSON has no NaN).
            "eval_loss": metrics.get("adapemu/eval_loss"),
            "steps": result.steps,
            "tokens": result.tokens,
            "train_seconds": result.seconds,
            "eval_seconds": eval_seconds,
            "package_version": int(broadcast.meta["package_version"]),
            "package_received": how,
            "metrics": metrics,
        },
    )
    state = ClientState(
        tensors={**prefixed("package", package), **prefixed("tokenizer", tokenizer)},
        meta={"version": int(broadcast.meta["package_version"])},
    )
    return update, state


def _base_named_parameters(
    blueprint: Blueprint, model: Any
) -> list[tuple[str, torch.nn.Parameter]]:
    """AdapEmu's parameters under base-model names (composite layer k -> its base index)."""
    order = blueprint.split.emulator_order
    out = []
    for name, param in model.named_parameters():
        parsed = blueprint.layout.parse(name)
        out.append(
            (name if parsed is None else blueprint.layout.key(order[parsed[0]], parsed[1]), param)
        )
    return out
