"""FewFedPIT's client step after W^l is trained (paper 004, Algorithm 1, lines 7-9).

Given the global adapter W^g_{r-1} and the private adapter W^l_{k,r} (trained on local data
from W^g_{r-1}, line 6, by FedAvg's client step), the tenant

- generates candidates with the global model M^g and filters them (line 7, SynGen;
  :mod:`~fedtune.algorithms.fewfedpit.synthesis`),
- keeps the ``keep`` candidates with the lowest instruction-following score under its
  private model M^l (Section 3.3; :mod:`~fedtune.algorithms.fewfedpit.ifs`),
- trains the public adapter W^g_{k,r} from W^g_{r-1} on them (line 8),
- and uploads ``beta * W^l + (1 - beta) * W^g_{k,r}`` (line 9, local aggregation sharing).

Everything here runs in the tenant's context; only the mix leaves it.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any

import torch

from fedtune.algorithms.fewfedpit import synthesis
from fedtune.algorithms.fewfedpit.config import FewFedPITConfig
from fedtune.algorithms.fewfedpit.ifs import instruction_following_score
from fedtune.core.errors import DataError
from fedtune.data.formats import Example
from fedtune.data.jsonl import write_jsonl
from fedtune.models import lora as lora_helpers
from fedtune.training.context import TenantContext, derive_seed
from fedtune.training.local import plan_steps, train_local

Adapter = dict[str, torch.Tensor]

log = logging.getLogger(__name__)


@dataclass
class PublicTraining:
    """What lines 7-8 produced: W^g_{k,r}, the kept synthetic data and what to report."""

    adapter: Adapter
    kept: list[Example] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    #: Codes of :data:`fedtune.core.update_meta.TENANT_FLAGS` (never free text: the update's
    #: metadata reaches the provider).
    flags: list[str] = field(default_factory=list)


def local_aggregation(private: Adapter, public: Adapter, beta: float) -> Adapter:
    """``beta * W^l + (1 - beta) * W^g`` per tensor (Algorithm 1, line 9).

    At ``beta = 1`` the result is W^l bit for bit and at ``beta = 0`` W^g (finite tensors):
    multiplying by 1.0 and adding 0.0 are exact in IEEE arithmetic.
    """
    if private.keys() != public.keys():
        raise ValueError(f"adapter names differ: {sorted(private.keys() ^ public.keys())}")
    return {
        name: (beta * private[name] + (1.0 - beta) * public[name]).to(private[name].dtype)
        for name in private
    }


def select_by_ifs(
    candidates: list[Example], score: Any, keep: int
) -> tuple[list[Example], list[float]]:
    """The ``keep`` candidates with the lowest IFS (ties: generation order), and their scores."""
    scored = [(score(example), index) for index, example in enumerate(candidates)]
    best = sorted(scored)[:keep]
    best.sort(key=lambda pair: pair[1])  # train in generation order, not score order
    return [candidates[i] for _, i in best], [s for s, _ in best]


def train_public(
    ctx: TenantContext,
    config: FewFedPITConfig,
    global_adapter: Adapter,
    private_adapter: Adapter,
    local: list[Example],
    round_index: int,
) -> PublicTraining:
    """Lines 7-8 of Algorithm 1: synthesise, select by IFS, train W^g on what was kept."""
    if len(local) < config.instruction_demos:
        message = (
            f"{len(local)} local training records, fewer than instruction_demos="
            f"{config.instruction_demos}"
        )
        if config.too_few_records == "refuse":
            raise DataError(
                f"tenant {ctx.tenant!r}: {message}, so FewFedPIT cannot build its prompts",
                fix="Give the tenant more records, lower algorithm.instruction_demos, or set "
                "algorithm.too_few_records: local-only to skip synthetic data for such tenants.",
            )
        log.info("tenant %s: synthetic data skipped: %s (too_few_records: local-only)", ctx.tenant, message)
        return PublicTraining(adapter=dict(global_adapter), flags=["fewfedpit/too-few-records"])

    tokenizer = ctx.tokenizer()
    generator = ctx.peft_model(global_adapter)  # M^g
    rng = random.Random(derive_seed(ctx.seed, "synthesis", round_index, ctx.tenant))
    with ctx.progress(f"{ctx.tenant}: synthetic data", 3 * config.candidates) as advance:
        report = synthesis.synthesize(
            local, synthesis.greedy(generator, tokenizer, config), config, rng, advance
        )
    metrics = {f"fewfedpit/{k}": float(v) for k, v in report.counts().items()}
    if not report.candidates:
        return PublicTraining(
            adapter=dict(global_adapter),
            metrics=metrics,
            flags=["fewfedpit/no-candidate"],
        )

    judge = ctx.peft_model(private_adapter)  # M^l scores the candidates
    kept, scores = select_by_ifs(
        report.candidates,
        lambda e: instruction_following_score(judge, tokenizer, e.instruction, e.response, e.input),
        config.keep,
    )
    model = ctx.peft_model(global_adapter)  # W^g_{r-1} is where line 8 starts
    encoded = ctx.encode(kept)
    if not encoded:  # every kept example longer than max_seq_len
        return PublicTraining(
            adapter=dict(global_adapter),
            kept=kept,
            scores=scores,
            metrics=metrics,
            flags=["fewfedpit/too-long"],
        )
    steps = config.synthetic_steps or plan_steps(ctx.training, len(encoded))
    seed = derive_seed(ctx.seed, "train-synthetic", round_index, ctx.tenant)
    result = train_local(
        model,
        lora_helpers.trainable_parameters(model),
        ctx.train_batches(encoded, steps, seed),
        ctx.training,
        seed=seed,
    )
    metrics.update(
        {
            "fewfedpit/kept": float(len(kept)),
            "fewfedpit/ifs_mean": sum(scores) / len(scores),
            "fewfedpit/synthetic_train_loss": result.loss,
            "fewfedpit/synthetic_steps": float(result.steps),
        }
    )
    return PublicTraining(
        adapter=lora_helpers.adapter_state(model), kept=kept, scores=scores, metrics=metrics
    )


def synthetic_jsonl(kept: list[Example], scores: list[float], round_index: int) -> bytes:
    """The kept synthetic examples as Alpaca JSONL the tenant can read (with IFS and round)."""
    return write_jsonl(
        {
            "instruction": e.instruction,
            "input": e.input,
            "output": e.response,
            "category": "synthetic",
            "ifs": score,
            "round": round_index,
        }
        for e, score in zip(kept, scores, strict=True)
    )
