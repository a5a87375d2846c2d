"""FedPT's provider side: the large model, the public KD set, and Eq. 5 distillation.

Each round (Algorithm 1, lines 8-10) the provider averages the small adapters (FedAvg), builds
the proxy-tuned large model from the average (Eq. 3) and distils it into the averaged small
model on a fixed KD set sampled once from its public data:

    L = CE(y | x; small) + gamma * KL(p_proxy(. | x) || p_small(. | x))              (Eq. 5)

Both terms are means over the response tokens of the KD examples (the tokens the small model
is trained to produce; the paper's text does not say which positions its KL covers). The
teacher is fixed during a round's distillation. The large model's log-probabilities on the KD
set and the held-out public examples never change, so they are computed once per job and kept
in the provider's store (``fedpt/large-logprobs-<digest>.safetensors``, float16).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from fedtune.algorithms.fedpt.config import (
    FedPTConfig,
    LargeHttpConfig,
    LargeModelConfig,
    LargePretrainedConfig,
)
from fedtune.algorithms.fedpt.proxy import LogitSource, ModelLogits, check_same_vocabulary
from fedtune.config.job import TinyModelConfig
from fedtune.core.errors import ConfigError, DataError, ModelError
from fedtune.data.formats import Example
from fedtune.data.tokenize import collate
from fedtune.models.proxy_decoding import combine
from fedtune.training.context import ProviderContext, build_model, derive_seed
from fedtune.training.local import batch_indices

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

Encoded = dict[str, list[int]]
CACHE_PREFIX = "fedpt/large-logprobs-"


# -- the large model ------------------------------------------------------------------------
@dataclass
class LargeModel:
    """The provider's black-box large model: a logit source and its vocabulary."""

    source: LogitSource
    vocab: dict[str, int]
    identity: str  # what the logit cache is keyed by
    local_model: PreTrainedModel | None = None  # set for tiny/pretrained (exportable)
    tokenizer: Any = None


def open_large_model(config: LargeModelConfig, ctx: ProviderContext) -> LargeModel:
    """Load or connect to the large model and check it shares the small model's vocabulary.

    Raises:
        ModelError: The large model's directory is missing or unloadable; the endpoint is
            unreachable.
        ConfigError: The vocabularies differ.
    """
    small_tok = ctx.tokenizer()
    if isinstance(config, LargeHttpConfig):
        from fedtune.algorithms.fedpt.http_source import HttpLogitSource
        from fedtune.models.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(config.tokenizer)
        check_same_vocabulary(
            small_tok.get_vocab(), tokenizer.get_vocab(), small_name="model", large_name=config.url
        )
        http = HttpLogitSource(config, tokenizer)
        http.probe()
        identity = json.dumps({"url": config.url, "model": config.model, "top_k": config.top_k})
        return LargeModel(source=http, vocab=tokenizer.get_vocab(), identity=identity, tokenizer=tokenizer)
    if isinstance(config, LargePretrainedConfig):
        _check_large_dir(config.uri)
        model, tokenizer = build_model(config.uri, "auto", runtime=ctx.runtime)
        name = config.uri
    else:
        assert isinstance(config, TinyModelConfig)
        model, tokenizer = build_model(config, ctx.tokenizer_spec, runtime=ctx.runtime)
        name = "algorithm.large_model (tiny)"
    check_same_vocabulary(
        small_tok.get_vocab(), tokenizer.get_vocab(), small_name="model", large_name=name
    )
    model.eval()
    identity = json.dumps(config.model_dump(), sort_keys=True)
    source = ModelLogits(model, vocab_size=len(tokenizer), name=name)
    return LargeModel(
        source=source,
        vocab=tokenizer.get_vocab(),
        identity=identity,
        local_model=model,
        tokenizer=tokenizer,
    )


def _check_large_dir(uri: str) -> None:
    """A local large-model path must exist (remote and hub URIs fail in the loader, by name)."""
    if "://" in uri and not uri.startswith("file://"):
        return
    path = Path(uri.removeprefix("file://"))
    if not path.is_dir():
        raise ModelError(
            f"algorithm.large_model.uri={uri!r} is not a directory",
            fix="Point algorithm.large_model.uri at the large model's Hugging Face directory "
            "(config.json, weights, tokenizer files), or use source: http for an endpoint.",
        )


# -- the public KD set ----------------------------------------------------------------------
@dataclass(frozen=True)
class PublicSets:
    """The fixed KD set and the held-out public examples (encoded; examples for generation)."""

    kd: list[Encoded]
    heldout: list[Encoded]
    heldout_examples: list[Example]


def public_sets(ctx: ProviderContext, config: FedPTConfig, kd_size: int) -> PublicSets:
    """Split the public data once per job (seeded): held-out share, then ``kd_size`` for KD
    (0 for fedavg-pt, which only evaluates).

    Raises:
        ConfigError: The KD set would be larger than the public data left after the held-out
            share.
    """
    examples = ctx.public_examples()
    order = list(range(len(examples)))
    random.Random(derive_seed(ctx.seed, "fedpt-public")).shuffle(order)
    n_held = int(len(examples) * config.public_eval_fraction)
    pool = order[n_held:]
    if kd_size > len(pool):
        raise ConfigError(
            f"algorithm.kd_size={kd_size} is larger than the public set: "
            f"{public_uri(ctx)} has {len(examples)} examples, {len(pool)} after holding out "
            f"public_eval_fraction={config.public_eval_fraction}",
            fix=f"Lower algorithm.kd_size to at most {len(pool)}, or use a larger public dataset.",
        )
    held = [examples[i] for i in order[:n_held]]
    kd = [examples[i] for i in pool[:kd_size]]
    held_rows, held_kept = encode_aligned(ctx, held)
    return PublicSets(kd=ctx.encode(kd) if kd else [], heldout=held_rows, heldout_examples=held_kept)


def encode_aligned(ctx: ProviderContext, examples: Sequence[Example]) -> tuple[list[Encoded], list[Example]]:
    """Encoded rows and the examples they came from, in step (too-long prompts dropped)."""
    rows: list[Encoded] = []
    kept: list[Example] = []
    for example in examples:
        try:
            (row,) = ctx.encode([example])
        except DataError:  # the prompt alone exceeds max_seq_len
            continue
        rows.append(row)
        kept.append(example)
    return rows, kept


def public_uri(ctx: ProviderContext) -> str:
    """The public dataset's URI as shown in errors."""
    return repr(ctx.public_data_uri)


# -- scoring at response positions ------------------------------------------------------------
def response_positions(row: Encoded) -> torch.Tensor:
    """Positions t whose logits predict a response token (``labels[t + 1] != -100``)."""
    labels = torch.tensor(row["labels"])
    return torch.nonzero(labels[1:] != -100).flatten()


def response_targets(row: Encoded) -> torch.Tensor:
    """The response tokens those positions predict."""
    labels = torch.tensor(row["labels"])
    return labels[1:][labels[1:] != -100]


def batches(n: int, size: int) -> list[list[int]]:
    """Consecutive index batches covering ``range(n)``."""
    return [list(range(s, min(s + size, n))) for s in range(0, n, size)]


def score_rows(
    score: Any, rows: Sequence[Encoded], pad_id: int, batch_size: int
) -> list[torch.Tensor]:
    """Float32 log-probabilities (n_i, V) at each row's response positions.

    ``score(input_ids, attention_mask) -> logits (B, T, V)`` (a :class:`LogitSource`'s
    ``logits`` or a module wrapped in :class:`ModelLogits`).
    """
    out: list[torch.Tensor] = []
    for idx in batches(len(rows), batch_size):
        batch = collate([rows[i] for i in idx], pad_id)
        with torch.no_grad():
            logits = score(batch["input_ids"], batch["attention_mask"])
        for b, i in enumerate(idx):
            out.append(F.log_softmax(logits[b, response_positions(rows[i])].float(), dim=-1))
    return out


# -- the cache of the large model's log-probabilities -----------------------------------------
def cache_key(large: LargeModel, sets: PublicSets) -> str:
    """Store key of the large model's log-probabilities on these exact public rows."""
    digest = hashlib.sha256(large.identity.encode())
    for row in [*sets.kd, *sets.heldout]:
        digest.update(json.dumps([row["input_ids"], row["labels"]]).encode())
    return f"{CACHE_PREFIX}{digest.hexdigest()[:24]}.safetensors"


def large_logprobs(
    ctx: ProviderContext, large: LargeModel, sets: PublicSets, batch_size: int
) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
    """The large model's log-probs on the KD and held-out rows, from the provider's store.

    Computed (and stored) only when the store has none for this model and these rows: every
    round after the first, and every resumed or re-run step, reads them back. Values are the
    float16 copies in the store either way, so a fresh and a cached round agree bitwise.
    Returns ``(kd, heldout, sequences_queried)``.
    """
    key = cache_key(large, sets)
    store = ctx.store
    queried = 0
    if store is None or not store.exists(key):
        pad_id = ctx.tokenizer().pad_token_id
        rows = [*sets.kd, *sets.heldout]
        scored = score_rows(large.source.logits, rows, pad_id, batch_size)
        queried = len(rows)
        tensors = {f"{i:06d}": t.to(torch.float16).contiguous() for i, t in enumerate(scored)}
        log.info("queried the large model on %d public example(s); cached as %s", queried, key)
        if store is None:
            loaded = tensors
        else:
            store.put_tensors(key, tensors)
            loaded = store.get_tensors(key)
    else:
        loaded = store.get_tensors(key)
    ordered = [loaded[f"{i:06d}"].to(torch.float32) for i in range(len(loaded))]
    return ordered[: len(sets.kd)], ordered[len(sets.kd) :], queried


# -- Eq. 3 teacher and Eq. 5 distillation ---------------------------------------------------
def proxy_teacher(
    large_lp: Sequence[torch.Tensor],
    pre_lp: Sequence[torch.Tensor],
    ft_lp: Sequence[torch.Tensor],
    alpha: float,
) -> list[torch.Tensor]:
    """Eq. 3 per row on log-probabilities, renormalised: ``log_softmax(z_L + a(z_ft - z_pre))``.

    Log-softmax shifts each position's logits by a constant, which Eq. 3 carries through
    unchanged, so log-probabilities give the same proxy distribution as raw logits.
    """
    return [
        F.log_softmax(combine(zl, zp, zf, alpha), dim=-1)
        for zl, zp, zf in zip(large_lp, pre_lp, ft_lp, strict=True)
    ]


def kl_rows(teacher: Sequence[torch.Tensor], student: Sequence[torch.Tensor]) -> float:
    """Mean over response tokens of KL(teacher || student), both given as log-probs."""
    total = sum(float((t.exp() * (t - s)).sum()) for t, s in zip(teacher, student, strict=True))
    count = sum(int(t.shape[0]) for t in teacher)
    return total / max(count, 1)


def eq5_loss(
    logits: torch.Tensor,
    batch_rows: Sequence[Encoded],
    teacher: Sequence[torch.Tensor],
    gamma: float,
) -> tuple[torch.Tensor, float, float]:
    """Eq. 5 on one batch of the student's logits (B, T, V): ``CE + gamma * KL``.

    Returns the loss and the CE and KL values (means over response tokens).
    """
    ce_sum = logits.new_zeros((), dtype=torch.float32)
    kl_sum = logits.new_zeros((), dtype=torch.float32)
    count = 0
    for b, row in enumerate(batch_rows):
        positions = response_positions(row)
        student = F.log_softmax(logits[b, positions].float(), dim=-1)
        targets = response_targets(row)
        ce_sum = ce_sum - student.gather(1, targets[:, None]).sum()
        t = teacher[b]
        kl_sum = kl_sum + (t.exp() * (t - student)).sum()
        count += int(positions.numel())
    count = max(count, 1)
    ce, kl = ce_sum / count, kl_sum / count
    loss = ce + gamma * kl if gamma != 0.0 else ce
    return loss, float(ce.detach()), float(kl.detach())


@dataclass(frozen=True)
class DistillResult:
    """The distilled adapter and what the distillation did."""

    adapter: dict[str, torch.Tensor]
    metrics: dict[str, float]


def distill(
    ctx: ProviderContext,
    config: FedPTConfig,
    student: Any,
    params: dict[str, torch.nn.Parameter],
    rows: Sequence[Encoded],
    teacher: Sequence[torch.Tensor],
    round_index: int,
) -> DistillResult:
    """``kd_steps`` steps of Eq. 5 on ``student``'s ``params`` (the LoRA tensors).

    Batches are drawn epoch by epoch from the KD set with a seed per round, so a re-run of
    the round distils identically. The optimizer is the job's client optimizer at ``kd_lr``,
    fresh each round (only the adapter is kept in the state). Under ``deepspeed`` the same
    steps run through a DeepSpeed engine.
    """
    from fedtune.models import lora as lora_helpers
    from fedtune.training.local import make_optimizer

    lr = config.kd_lr if config.kd_lr is not None else ctx.training.lr
    training = ctx.training.model_copy(update={"lr": lr})
    seed = derive_seed(ctx.seed, "fedpt-kd", round_index)
    pad_id = ctx.tokenizer().pad_token_id
    student.train()
    runtime = ctx.runtime
    if config.deepspeed is None:
        runtime.master(params)
    optimizer = make_optimizer(list(params.values()), training)
    stepper = runtime.stepper(optimizer)
    engine: Any = None
    if config.deepspeed is not None:
        from fedtune.training.deepspeed import DeepSpeedTrainer, build_config, load_config_file

        section = config.deepspeed
        ds_config = build_config(
            micro_batch_size=config.kd_batch_size,
            zero_stage=section.zero_stage,
            bf16=section.bf16,
            base=load_config_file(section.config_path) if section.config_path else None,
        )
        engine = DeepSpeedTrainer(student, params.values(), optimizer, ds_config)
    device = engine.device if engine is not None else runtime.device
    forward = engine if engine is not None else runtime.forward(student)
    ce_values: list[float] = []
    kl_values: list[float] = []
    torch.manual_seed(seed)
    try:
        # Autocast recasts LoRA inputs anyway (DeepSpeed's bf16 casts the adapters themselves).
        with runtime.adapter_inputs_uncast(student) if engine is None else contextlib.nullcontext():
            for idx in batch_indices(len(rows), config.kd_batch_size, config.kd_steps, seed):
                batch = collate([rows[i] for i in idx], pad_id)
                with runtime.autocast():
                    logits = forward(
                        input_ids=batch["input_ids"].to(device),
                        attention_mask=batch["attention_mask"].to(device),
                    ).logits.cpu()
                loss, ce, kl = eq5_loss(
                    logits, [rows[i] for i in idx], [teacher[i] for i in idx], config.gamma
                )
                if engine is not None:
                    engine.backward(loss)
                    engine.step()
                else:
                    optimizer.zero_grad(set_to_none=True)
                    stepper.backward(loss)
                    stepper.step()
                ce_values.append(ce)
                kl_values.append(kl)
        if engine is not None:
            # Read back through DeepSpeed (gathered under ZeRO-3) by the module's own names.
            trained = engine.state(n for n, p in student.named_parameters() if p.requires_grad)
    finally:
        if engine is not None:
            engine.close()
    if engine is not None:
        live = dict(student.named_parameters())
        for name, tensor in trained.items():
            live[name].data = tensor
    student.eval()
    metrics = {"kd/steps": float(len(ce_values))}
    if ce_values:
        metrics["kd/train_ce"] = sum(ce_values) / len(ce_values)
        metrics["kd/train_kl"] = sum(kl_values) / len(kl_values)
    return DistillResult(adapter=lora_helpers.adapter_state(student), metrics=metrics)


# -- generation quality on held-out public examples ------------------------------------------
def prompt_ids(row: Encoded) -> list[int]:
    """The prompt part of an encoded row (everything before the first response label)."""
    first = next(i for i, label in enumerate(row["labels"]) if label != -100)
    return list(row["input_ids"][:first])


def generation_metrics(
    tokenizer: Any,
    rows: Sequence[Encoded],
    references: Sequence[str],
    generate_ids: Any,
    prefix: str,
) -> dict[str, float]:
    """Rouge-L (F, stemmed) and Dist-3/Dist-4 of greedy generations for ``rows``' prompts.

    ``generate_ids(prompt_ids) -> new ids``. Keys are ``<prefix>/rouge_l``, ``<prefix>/dist3``
    and ``<prefix>/dist4`` (FedPT's Table 2 and Table 8 metrics).
    """
    from fedtune.eval.diversity import distinct_n
    from fedtune.eval.rouge import rouge_l_corpus

    texts = [
        str(tokenizer.decode(generate_ids(prompt_ids(row)), skip_special_tokens=True)).strip()
        for row in rows
    ]
    return {
        f"{prefix}/rouge_l": rouge_l_corpus(texts, list(references)),
        f"{prefix}/dist3": distinct_n(texts, 3),
        f"{prefix}/dist4": distinct_n(texts, 4),
    }
