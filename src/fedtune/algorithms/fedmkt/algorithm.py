"""FedMKT behind the phase interface (paper 003, Algorithm 1 and Appendix A).

- ``init_state`` (provider): every tenant tokenizer loads and top-k fits every vocabulary; the
  tenant -> LLM MinED tables are computed (cached in the provider's store); the LLM's LoRA
  adapter starts from the job seed; the public set's hash is recorded.
- ``configure_round``: the LLM's knowledge of the previous round (none in round 1), the LLM's
  tokenizer files (to read it), the public-set hash. Never the LLM's weights.
- ``client_step`` (tenant): check the public-set hash; finish the previous round with its
  LLM -> SLM transfer (DualMinCE, aligned; see the tenant section below); fine-tune the
  tenant's own small model on its private data; return its knowledge on the public set;
  score the small model on the tenant's held-out split (accuracy and Rouge-L,
  :mod:`.scoring`), metrics only. The small model's adapter, tables and alignments stay in
  the client state, which also lists the rounds whose transfer it has had (``transfers``).
- ``aggregate`` (provider): align -> select -> distil into the LLM -> the LLM's knowledge for
  the next broadcast; score the LLM on the public set's held-out tail (``llm_eval_size``).
- ``final_broadcast``: the last round's LLM knowledge (as ``configure_round``'s).
- ``export``: the LLM (base + adapter), registered as ``<name>``.
- ``finish_kept`` / ``evaluate_kept`` / ``export_kept`` (tenant, after the last round): the
  last round's LLM -> SLM transfer, then the small model's final scores, and the small model
  (base + adapter) written into the tenant's own store only.

Homogeneous mode (``fedavg_small``, paper 003 Table 3; every tenant declares the same small
model, checked by the job): tenants also upload their small model's LoRA adapter
(``slm_adapter/*``), the provider averages them (FedAvg, weighted by samples) and broadcasts the
average, which every tenant starts its next round from. Only adapters cross.

Metric keys name the model: ``server/eval/llm/acc``, ``eval/slm/acc/<tenant>`` per round,
``final/slm/acc/<tenant>`` at the end (``rouge_l`` likewise).

Loss on both sides: ``ce_weight * CE + (1 - ce_weight) * KD`` (the paper's lambda = 0.9).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedtune.aggregation import weighted_mean
from fedtune.algorithms.base import Artifact
from fedtune.algorithms.fedavg import LoraFedAlgorithm
from fedtune.algorithms.fedmkt import client, public, scoring, server
from fedtune.algorithms.fedmkt.config import FedMKTConfig
from fedtune.algorithms.fedmkt.knowledge import (
    FIELDS,
    Knowledge,
    check_top_k,
    compute_knowledge,
    value_problems,
)
from fedtune.algorithms.fedmkt.transfer import DictCache, DistilSettings, Side, Teacher, distil
from fedtune.algorithms.registry import register
from fedtune.core.errors import ConfigError, ModelError, UpdateRejected
from fedtune.core.messages import Broadcast, ClientState, ServerState, Update, prefixed
from fedtune.data.formats import Example
from fedtune.models import lora as lora_helpers
from fedtune.training.context import (
    ProviderContext,
    TenantContext,
    TenantData,
    derive_seed,
    tokenizer_from_tensors,
    tokenizer_to_tensors,
)
from fedtune.training.local import make_optimizer, plan_steps, train_local

KNOWLEDGE = "knowledge"
SLM_ADAPTER = "slm_adapter"
_DTYPES = {
    "sample": torch.int32, "ce": torch.float32, "tokens": torch.int32, "token_offsets": torch.int64,
    "positions": torch.int32, "position_offsets": torch.int64, "topk_ids": torch.int32,
    "topk_logprobs": torch.float16,
}


@register
class FedMKT(LoraFedAlgorithm[FedMKTConfig]):
    """Mutual knowledge transfer between the provider's LLM and tenants' own small models."""

    # -- shared -------------------------------------------------------------------------------
    def _public(self, examples: list[Example]) -> list[Example]:
        """The transfer rows: all but the LLM's held-out tail, then the first ``public_size``."""
        rows = examples[: len(examples) - self.config.llm_eval_size]
        if not rows:
            raise ConfigError(
                f"algorithm.llm_eval_size={self.config.llm_eval_size} holds out all "
                f"{len(examples)} public examples, leaving none to transfer knowledge on",
                fix="Lower algorithm.llm_eval_size below the public set's size.",
            )
        return rows[: self.config.public_size] if self.config.public_size else rows

    def _score(self, model: Any, tokenizer: Any, held_out: list[Example], labels_from: list[Example], prefix: str) -> dict[str, float]:
        """``prefix/acc`` and ``prefix/rouge_l`` of a model (see :mod:`.scoring`)."""
        if not held_out:
            return {}
        found = scoring.score_model(
            model, tokenizer, held_out, labels_from=labels_from, max_options=self.config.eval_max_options,
            max_new_tokens=self.config.eval_max_new_tokens, batch_size=self.config.kd_batch_size,
        )
        return {f"{prefix}/{k}": v for k, v in found.items()}

    # Shared by both halves: each takes the context of the side it runs on.
    def _settings(self, ctx: ProviderContext | TenantContext, tokenizer: Any, purpose: str, round_index: int) -> DistilSettings:
        return DistilSettings(
            ce_weight=self.config.ce_weight,
            epochs=self.config.kd_epochs,
            batch_size=self.config.kd_batch_size,
            seed=derive_seed(ctx.seed, "fedmkt", purpose, round_index),
            pad_id=tokenizer.pad_token_id,
            vocab_size=len(tokenizer),
            runtime=ctx.runtime,
        )

    def _knowledge(self, ctx: ProviderContext | TenantContext, model: Any, tokenizer: Any, side: Side, chars: list[int], top_k: int) -> Knowledge:
        return compute_knowledge(
            model, side.rows, side.samples.tolist(), chars, pad_id=tokenizer.pad_token_id,
            vocab_size=len(tokenizer), top_k=top_k, batch_size=self.config.kd_batch_size,
        )

    def _distil(self, ctx: ProviderContext | TenantContext, model: Any, tokenizer: Any, side: Side, teachers: dict[int, Teacher], purpose: str, round_index: int) -> dict[str, float]:
        lr = self.config.kd_lr or ctx.training.lr
        params = lora_helpers.trainable_parameters(model)
        ctx.runtime.master(params)
        optimizer = make_optimizer(list(params.values()), ctx.training.model_copy(update={"lr": lr}))
        return distil(model, optimizer, side.rows, teachers, self._settings(ctx, tokenizer, purpose, round_index))

    def _tenant_tokenizers(self, ctx: ProviderContext) -> dict[str, Any]:
        return ctx.memo("fedmkt-tenant-tokenizers", lambda: {
            name: server.tenant_tokenizer(name, spec, self.config.top_k)
            for name, spec in sorted(ctx.tenant_tokenizers.items())
        })

    # -- provider -----------------------------------------------------------------------------
    def init_state(self, ctx: ProviderContext) -> ServerState:
        from fedtune.algorithms.fedmkt.vocab import cached_mapping

        llm_tok = ctx.tokenizer()
        check_top_k(self.config.top_k, len(llm_tok), "the provider's LLM tokenizer")
        for tokenizer in self._tenant_tokenizers(ctx).values():
            cached_mapping(ctx.store, tokenizer, llm_tok)
        state = super().init_state(ctx)
        state.meta["public_hash"] = public.public_hash(self._public(ctx.public_examples()))
        return state

    def configure_round(self, ctx: ProviderContext, state: ServerState, round_index: int) -> Broadcast:
        meta = {
            "round": round_index, "public_hash": state.meta["public_hash"], "top_k": self.config.top_k,
            # What check_update bounds each tenant's token ids by (tokenizers are declared public).
            "tenant_vocab_sizes": {name: len(tok) for name, tok in self._tenant_tokenizers(ctx).items()},
        }
        return Broadcast(tensors=self._for_tenants(ctx, state), meta=meta)

    def _for_tenants(self, ctx: ProviderContext, state: ServerState) -> dict[str, torch.Tensor]:
        """What a tenant transfers from, by allowlist: the LLM's knowledge of the last round
        (none before round 1), the LLM's tokenizer files (to read it) and, in homogeneous
        mode, the small models' average. Never the LLM's weights."""
        tensors = {k: v for k, v in state.tensors.items() if k.startswith((KNOWLEDGE + "/", SLM_ADAPTER + "/"))}
        tensors.update(prefixed("tokenizer", tokenizer_to_tensors(ctx.tokenizer())))
        return tensors

    def tenant_broadcast_meta(self, meta: dict[str, Any], tenant: str) -> dict[str, Any] | None:
        """A tenant's copy names its own vocabulary size only: the provider's record keeps
        every tenant's (check_update reads it), which would tell a tenant who the others are."""
        sizes = meta.get("tenant_vocab_sizes")
        if sizes is None:
            return None
        own = {tenant: sizes[tenant]} if tenant in sizes else {}
        return {**{k: meta[k] for k in ("round", "public_hash", "top_k") if k in meta},
                "tenant_vocab_sizes": own}

    def check_update(self, tenant: str, update: Update, broadcast: Broadcast, max_bytes: int) -> None:
        """Exactly the knowledge arrays, of their dtypes and consistent shapes, values in bounds
        (:func:`~fedtune.algorithms.fedmkt.knowledge.value_problems`), token ids inside the
        tenant's vocabulary (and in homogeneous mode the small model's adapter,
        see :meth:`_check_slm_adapter`)."""
        problems: list[str] = []
        expected = {f"{KNOWLEDGE}/{name}" for name in FIELDS}
        adapter = update.group(SLM_ADAPTER)
        if self.config.fedavg_small:
            expected |= {f"{SLM_ADAPTER}/{k}" for k in adapter}
            problems += _check_slm_adapter(adapter, broadcast.group(SLM_ADAPTER))
        if set(update.tensors) != expected:
            problems.append(f"keys {sorted(set(update.tensors) ^ expected)} differ from a knowledge message")
        else:
            t = {name: update.tensors[f"{KNOWLEDGE}/{name}"] for name in FIELDS}
            for name, dtype in _DTYPES.items():
                if t[name].dtype != dtype:
                    problems.append(f"{name} is {t[name].dtype}, expected {dtype}")
            n, p = t["sample"].shape[0], t["positions"].shape[0]
            if tuple(t["topk_ids"].shape) != (p, int(broadcast.meta["top_k"])) or t["topk_logprobs"].shape != t["topk_ids"].shape:
                problems.append(f"top-k arrays {tuple(t['topk_ids'].shape)} are not ({p}, {broadcast.meta['top_k']})")
            if t["ce"].shape[0] != n or t["token_offsets"].shape[0] != n + 1 or t["position_offsets"].shape[0] != n + 1:
                problems.append("per-sample arrays disagree in length")
            elif not problems:  # shapes and dtypes as a knowledge message's: bound the values
                problems += value_problems(t)
            if (t["topk_ids"] < 0).any() or (t["tokens"] < 0).any():
                problems.append("negative token ids")
            vocab = (broadcast.meta.get("tenant_vocab_sizes") or {}).get(tenant)
            largest = max((int(t[n].max()) for n in ("topk_ids", "tokens") if t[n].numel()), default=-1)
            if vocab is not None and largest >= int(vocab):
                problems.append(f"token id {largest} is beyond the tenant's vocabulary of {vocab} tokens")
        if update.nbytes > max_bytes:
            problems.append(f"{update.nbytes} bytes exceed limits.max_update_bytes={max_bytes}")
        if problems:
            raise UpdateRejected(f"tenant {tenant!r}: knowledge message rejected: " + "; ".join(problems))

    def aggregate(self, ctx: ProviderContext, state: ServerState, updates: dict[str, Update], round_index: int) -> ServerState:
        """Algorithm 1 (server): align -> DualMinCE -> distil into the LLM -> its new knowledge.
        With ``llm_frozen`` (LLM2SLM) the tenants' knowledge is not used: the LLM stays as it
        is and only its knowledge is recomputed for the broadcast."""
        llm_tok = ctx.tokenizer()
        examples = self._public(ctx.public_examples())
        side, chars = public.side(llm_tok, examples, ctx.training.max_seq_len)
        model = ctx.peft_model(state.group("adapter"))
        if self.config.llm_frozen:
            return self._frozen(ctx, state, model, llm_tok, side, chars, updates, round_index)
        own = self._knowledge(ctx, model, llm_tok, side, chars, 1)
        received = {name: Knowledge.from_tensors(u.tensors) for name, u in updates.items()}
        tokenizers = self._tenant_tokenizers(ctx)
        teachers, metrics = server.selected_teachers(
            ctx.store, side, own.ce, received, tokenizers, llm_tok,
            state.meta["public_hash"], len(examples),
        )
        trained = self._distil(ctx, model, llm_tok, side, teachers, "llm", round_index)
        after = self._knowledge(ctx, model, llm_tok, side, chars, self.config.top_k)
        metrics.update({f"fedmkt/llm_kd_{k}": v for k, v in trained.items()})
        metrics["eval/llm/public_ce_before"] = float(np.mean(own.ce))
        metrics["eval/llm/public_ce"] = float(np.mean(after.ce))
        metrics.update(self._llm_scores(ctx, model, llm_tok))
        for name, k in received.items():
            metrics[f"eval/{name}/public_ce"] = float(np.mean(k.ce))
        return self._state(state, model, after, updates, metrics, round_index)

    def _frozen(self, ctx: ProviderContext, state: ServerState, model: Any, llm_tok: Any, side: Side, chars: list[int], updates: dict[str, Update], round_index: int) -> ServerState:
        """LLM2SLM's provider step: the unchanged LLM's knowledge (and scores), no distillation."""
        after = self._knowledge(ctx, model, llm_tok, side, chars, self.config.top_k)
        metrics = {"eval/llm/public_ce": float(np.mean(after.ce)), **self._llm_scores(ctx, model, llm_tok)}
        return self._state(state, model, after, updates, metrics, round_index)

    def _state(self, state: ServerState, model: Any, knowledge: Knowledge, updates: dict[str, Update], metrics: dict[str, float], round_index: int) -> ServerState:
        """The LLM's adapter, its knowledge and, in homogeneous mode, the averaged small-model
        adapter (FedAvg: sample-weighted mean of the tenants' uploads)."""
        tensors = {**prefixed("adapter", lora_helpers.adapter_state(model)), **knowledge.to_tensors(KNOWLEDGE)}
        if self.config.fedavg_small:
            names = sorted(updates)
            mean = weighted_mean([updates[n].group(SLM_ADAPTER) for n in names], self.client_weights(updates, names), names=names)
            tensors.update(prefixed(SLM_ADAPTER, mean))
            metrics["fedmkt/slm_averaged"] = float(len(names))
        return ServerState(
            tensors=tensors,
            meta={"round": round_index, "public_hash": state.meta["public_hash"], "metrics": metrics},
        )

    def _llm_scores(self, ctx: ProviderContext, model: Any, llm_tok: Any) -> dict[str, float]:
        """The LLM's scores on the public set's held-out tail (``llm_eval_size``)."""
        everything = ctx.public_examples()
        held_out = everything[len(everything) - self.config.llm_eval_size :] if self.config.llm_eval_size else []
        return self._score(model, llm_tok, held_out, everything, "eval/llm")

    def final_broadcast(self, ctx: ProviderContext, state: ServerState) -> Broadcast:
        """What the last round's LLM -> SLM transfer needs (:meth:`_for_tenants`; Algorithm 1
        ends every round with it, see :meth:`finish_kept`). Nothing of the LLM's weights."""
        meta = {"round": int(state.meta.get("round", 0)) + 1, "final": True,
                "public_hash": state.meta["public_hash"], "top_k": self.config.top_k}
        return Broadcast(tensors=self._for_tenants(ctx, state), meta=meta)

    # -- tenant -------------------------------------------------------------------------------
    # Algorithm 1 ends round r with the LLM -> SLM transfer (ClientUpdate2, Appendix A steps
    # 9-11), which needs the LLM's round-r knowledge: it exists only once the tenant's round-r
    # step has returned. A tenant acts only in its own steps, so round r's transfer is the first
    # thing its next step does: the next client step, or after the last round the final step
    # (finish_kept). The order of work is the paper's; every transfer is applied, the last too.
    def client_step(
        self, ctx: TenantContext, broadcast: Broadcast, data: TenantData, client_state: ClientState | None
    ) -> tuple[Update, ClientState | None]:
        """Algorithm 1 (client): the previous round's LLM -> SLM transfer (where the broadcast
        carries the LLM's knowledge: from round 2), then this round's local fine-tuning
        (ClientUpdate1) and the small model's knowledge on the public set."""
        round_index = int(broadcast.meta["round"])
        small = self._small(ctx, broadcast, client_state)
        metrics = self._transfer(ctx, small, broadcast)
        model = small.model
        encoded = ctx.encode(data.train)
        seed = derive_seed(ctx.seed, "train", round_index, data.tenant)
        result = train_local(
            model, lora_helpers.trainable_parameters(model),
            ctx.train_batches(encoded, plan_steps(ctx.training, len(encoded)), seed), ctx.training, seed=seed,
        )
        knowledge = self._knowledge(ctx, model, small.tok, small.side, small.chars, self.config.top_k)
        metrics["public_ce"] = float(np.mean(knowledge.ce))
        scores = self._score(model, small.tok, list(data.eval), [*data.train, *data.eval], "eval/slm")
        metrics.update(scores)
        tensors = knowledge.to_tensors(KNOWLEDGE)
        if self.config.fedavg_small:
            tensors.update(prefixed(SLM_ADAPTER, lora_helpers.adapter_state(model)))
        update = Update(
            tensors=tensors,
            meta={
                "num_samples": len(encoded),
                "train_loss": result.loss,
                "eval_loss": self._eval_loss(ctx, model, data),
                "metrics": metrics,
            },
        )
        return update, small.kept(round_index, scores)

    def finish_kept(self, ctx: TenantContext, broadcast: Broadcast, data: TenantData, client_state: ClientState) -> ClientState:
        """The last round's LLM -> SLM transfer (Algorithm 1's last client line, from the final
        broadcast's knowledge), then the final small model's scores (:meth:`evaluate_kept`)."""
        small = self._small(ctx, broadcast, client_state)
        self._transfer(ctx, small, broadcast)
        scores = self._score(small.model, small.tok, list(data.eval), [*data.train, *data.eval], "eval/slm")
        return small.kept(int(client_state.meta.get("round", 0)), scores)

    def _small(self, ctx: TenantContext, broadcast: Broadcast, client_state: ClientState | None) -> _Small:
        """The tenant's small model as its kept state (or, in homogeneous mode, the broadcast
        average) has it, with its view of the public set (checked against the provider's)."""
        examples = self._public(ctx.shared_public_examples())
        public.check_same_public(broadcast.meta["public_hash"], examples, ctx.public_data_uri, f"tenant {ctx.tenant!r}")
        tok = ctx.tokenizer()
        check_top_k(self.config.top_k, len(tok), f"tenant {ctx.tenant!r}'s tokenizer")
        kept = client_state.tensors if client_state is not None else {}
        adapter = {k[len("adapter/"):]: v for k, v in kept.items() if k.startswith("adapter/")} or None
        if self.config.fedavg_small and broadcast.group(SLM_ADAPTER):
            adapter = broadcast.group(SLM_ADAPTER)  # homogeneous mode: start from the average
        side, chars = public.side(tok, examples, ctx.training.max_seq_len)
        transfers = [int(r) for r in (client_state.meta.get("transfers") or [])] if client_state else []
        return _Small(ctx.peft_model(adapter), tok, client.restore_cache(kept), side, chars, len(examples), transfers)

    def _transfer(self, ctx: TenantContext, small: _Small, broadcast: Broadcast) -> dict[str, float]:
        """The LLM -> SLM transfer of the round before ``broadcast``'s, where it carries the
        LLM's knowledge: align, DualMinCE, ``lambda * CE + (1 - lambda) * KD`` on the public
        set (Eq. L_3). Counted in ``small.transfers``; returns its ``slm_kd_*`` metrics."""
        if f"{KNOWLEDGE}/ce" not in broadcast.tensors:
            return {}
        round_index = int(broadcast.meta["round"])
        llm = Knowledge.from_tensors(broadcast.tensors, KNOWLEDGE)
        llm_tok = tokenizer_from_tensors(broadcast.group("tokenizer"))
        own = self._knowledge(ctx, small.model, small.tok, small.side, small.chars, 1)
        teachers = client.selected_teachers(
            small.cache, small.side, own.ce, llm, llm_tok, small.tok, broadcast.meta["public_hash"], small.n_public
        )
        trained = self._distil(ctx, small.model, small.tok, small.side, teachers, f"slm-{ctx.tenant}", round_index)
        small.transfers.append(round_index - 1)
        return {f"slm_kd_{k}": v for k, v in trained.items()}

    def evaluate(self, ctx: TenantContext, broadcast: Broadcast, data: TenantData) -> dict[str, float]:
        """The final broadcast carries no model for tenants (see :meth:`evaluate_kept`)."""
        return {}

    def evaluate_kept(self, ctx: TenantContext, data: TenantData, client_state: ClientState) -> dict[str, float]:
        """The final small model's scores, as ``slm/acc``, ``slm/rouge_l``: those
        :meth:`finish_kept` took after the last round's transfer (nothing changes it later)."""
        found = client_state.meta.get("metrics") or {}
        return {k.removeprefix("eval/"): float(v) for k, v in found.items()}

    def tenant_model(self, ctx: TenantContext, broadcast: Broadcast) -> tuple[Any, Any]:
        """None: tenants never receive the LLM (its knowledge only); see :meth:`kept_model`."""
        raise ModelError(
            f"tenant {ctx.tenant!r}: FedMKT's broadcasts carry the LLM's knowledge, never a model "
            "a tenant can run",
            fix="Run the tenant's own small model (kept_model of its final client state).",
        )

    def kept_model(self, ctx: TenantContext, client_state: ClientState) -> tuple[Any, Any]:
        """The tenant's own small model (base + kept adapter) and its tokenizer."""
        adapter = {k[len("adapter/"):]: v for k, v in client_state.tensors.items() if k.startswith("adapter/")}
        return ctx.peft_model(adapter), ctx.tokenizer()

    def export_kept(self, ctx: TenantContext, client_state: ClientState, out_dir: Path) -> dict[str, Artifact]:
        """The tenant's small model: its base as a Hugging Face directory, the adapter in
        ``adapter/`` (the layout of the LLM's export)."""
        from fedtune.models.loading import save_pretrained_dir

        model_dir = out_dir / "slm"
        base, tokenizer = ctx.base.build(ctx.runtime)
        save_pretrained_dir(base, tokenizer, model_dir)
        lora_helpers.save_adapter(self.kept_model(ctx, client_state)[0], model_dir / "adapter")
        tags = {
            "algorithm": "fedmkt", "tenant": ctx.tenant, "rounds": str(client_state.meta.get("round", 0)),
            "lora_r": str(ctx.lora_config.r), "fedtune.layout": "base+adapter",
        }
        return {"slm": Artifact(kind="base-with-adapter", path=model_dir, register=True, tags=tags)}


@dataclass
class _Small:
    """A tenant's small model during one of its steps, and what its kept state carries."""

    model: Any
    tok: Any
    cache: DictCache
    side: Side
    chars: list[int]
    n_public: int
    #: The rounds whose LLM -> SLM transfer this model has had, in order.
    transfers: list[int]

    def kept(self, round_index: int, scores: dict[str, float]) -> ClientState:
        """The client state: the adapter, the tables and alignments, the scores."""
        return ClientState(
            tensors={**prefixed("adapter", lora_helpers.adapter_state(self.model)), **client.cache_tensors(self.cache)},
            meta={"round": round_index, "metrics": scores, "transfers": list(self.transfers)},
        )


def _check_slm_adapter(adapter: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> list[str]:
    """Problems of a homogeneous-mode adapter upload: missing, non-float or non-finite tensors,
    or (from round 2) keys and shapes other than the broadcast average's."""
    if not adapter:
        return [f"no {SLM_ADAPTER}/* tensors (algorithm.fedavg_small: true averages them)"]
    problems = [f"{SLM_ADAPTER}/{k} is {t.dtype}, not floating point" for k, t in adapter.items() if not t.is_floating_point()]
    problems += [f"{SLM_ADAPTER}/{k} holds NaN/Inf" for k, t in adapter.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if reference:
        if set(adapter) != set(reference):
            problems.append(f"{SLM_ADAPTER} keys {sorted(set(adapter) ^ set(reference))} differ from the broadcast average's")
        else:
            problems += [
                f"{SLM_ADAPTER}/{k} has shape {tuple(t.shape)}, the average {tuple(reference[k].shape)}"
                for k, t in adapter.items() if t.shape != reference[k].shape
            ]
    return problems
