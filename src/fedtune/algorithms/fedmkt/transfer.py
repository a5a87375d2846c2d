"""Knowledge transfer into one receiver: aligned teachers from a sender's knowledge, then
``lambda * CE + (1 - lambda) * KD`` training on the public set (paper 003, Eq. L_2 on the
provider, L_3 on a tenant).

As the paper's losses read, the CE term (L_ft) covers every public sample and the KD term
(L_kd) only the samples DualMinCE selected; both are means over response tokens. Alignments
depend only on the two tokenizers and the fixed public set, so they are cached (by both
tokenizers' content hashes and the public set's hash) through a :class:`TensorCache`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from fedtune.algorithms.fedmkt.align import align_tokens, map_topk, one_hot, receiver_sources
from fedtune.algorithms.fedmkt.knowledge import Knowledge, response_positions
from fedtune.data.tokenize import collate
from fedtune.training.distill import topk_kd, weighted_ce_kd
from fedtune.training.precision import Runtime

if TYPE_CHECKING:
    from fedtune.storage.base import Store

Teacher = tuple[np.ndarray, np.ndarray]  # (Q, k) receiver ids, (Q, k) log-probabilities


class TensorCache(Protocol):
    """Where computed-once arrays are kept: the provider's store, or a tenant's client state."""

    def load(self, key: str) -> dict[str, torch.Tensor] | None: ...

    def save(self, key: str, tensors: dict[str, torch.Tensor]) -> None: ...


@dataclass
class StoreCache:
    """A :class:`TensorCache` in a store (the provider's), one safetensors file per key."""

    store: Store | None
    hits: int = 0

    def load(self, key: str) -> dict[str, torch.Tensor] | None:
        if self.store is None or not self.store.exists(f"{key}.safetensors"):
            return None
        self.hits += 1
        return self.store.get_tensors(f"{key}.safetensors")

    def save(self, key: str, tensors: dict[str, torch.Tensor]) -> None:
        if self.store is not None:
            self.store.put_tensors(f"{key}.safetensors", tensors)


@dataclass
class DictCache:
    """A :class:`TensorCache` in memory, persisted by the tenant in its client state."""

    entries: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    hits: int = 0

    def load(self, key: str) -> dict[str, torch.Tensor] | None:
        found = self.entries.get(key)
        self.hits += found is not None
        return found

    def save(self, key: str, tensors: dict[str, torch.Tensor]) -> None:
        self.entries[key] = tensors


#: The version names the alignment rules: an alignment cached by older rules is not read back.
ALIGN_CACHE_PREFIX = "fedmkt/align-v2-"


@dataclass(frozen=True)
class Side:
    """One party's view of the public set: its canonical token texts and encoded rows."""

    canon: Sequence[str | None]
    rows: Sequence[dict[str, list[int]]]
    samples: np.ndarray  # public index of each row
    identity: str  # tokenizer content hash (cache keys)


def alignment(sender: Knowledge, sender_side: Side, receiver: Side, public_hash: str, cache: TensorCache) -> list[np.ndarray | None]:
    """Per receiver row, the sender token position each of its tokens takes knowledge from
    (-1: none); None where the sender has no such sample. Computed once per pair and set."""
    digest = hashlib.sha256(f"{sender_side.identity}|{receiver.identity}|{public_hash}".encode())
    key = f"{ALIGN_CACHE_PREFIX}{digest.hexdigest()[:32]}"
    found = cache.load(key)
    if found is None:
        by_sample = {int(s): r for r, s in enumerate(sender.sample)}
        flat: list[np.ndarray] = []
        for row, sample in zip(receiver.rows, receiver.samples, strict=True):
            r = by_sample.get(int(sample))
            if r is None:
                flat.append(np.full(len(row["input_ids"]), -2, dtype=np.int32))
                continue
            src = [sender_side.canon[t] for t in sender.sample_tokens(r)]
            dst = [receiver.canon[t] for t in row["input_ids"]]
            flat.append(receiver_sources(align_tokens(src, dst), len(dst)).astype(np.int32))
        lengths = [len(f) for f in flat]
        found = {
            "sources": torch.from_numpy(np.concatenate(flat) if flat else np.zeros(0, np.int32)),
            "offsets": torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)),
        }
        cache.save(key, found)
    sources, offsets = found["sources"].numpy(), found["offsets"].numpy()
    out: list[np.ndarray | None] = []
    for i in range(len(receiver.rows)):
        part = sources[offsets[i] : offsets[i + 1]]
        out.append(None if part.size and part[0] == -2 else part.astype(np.int64))
    return out


def teacher_for_row(
    sender: Knowledge, sender_row: int, sources: np.ndarray, receiver_row: dict[str, list[int]], table: np.ndarray
) -> Teacher:
    """The receiver's teacher at its response positions: the aligned sender top-k mapped onto
    its vocabulary, or a one-hot of its own token where nothing aligns (paper's appendix)."""
    positions = response_positions(receiver_row["labels"])
    own = np.asarray(receiver_row["input_ids"], dtype=np.int64)[positions]
    k = sender.top_k
    ids, values = one_hot(own, k)
    s_pos, s_ids, s_lp = sender.sample_topk(sender_row)
    where = {int(p): i for i, p in enumerate(s_pos)}
    for q, p in enumerate(sources[positions]):
        i = where.get(int(p)) if p >= 0 else None
        if i is not None:
            ids[q], values[q] = map_topk(s_ids[i : i + 1], s_lp[i : i + 1], table)
    return ids, values


def teachers(
    sender: Knowledge,
    chosen: np.ndarray,
    sources: list[np.ndarray | None],
    receiver: Side,
    table: np.ndarray,
    sender_index: int = 0,
) -> dict[int, Teacher]:
    """Teachers of the receiver rows whose sample DualMinCE gave to this sender (``chosen``
    indexed by public sample)."""
    by_sample = {int(s): r for r, s in enumerate(sender.sample)}
    out: dict[int, Teacher] = {}
    for i, (row, sample) in enumerate(zip(receiver.rows, receiver.samples, strict=True)):
        r = by_sample.get(int(sample))
        if chosen[int(sample)] != sender_index or r is None or sources[i] is None:
            continue
        out[i] = teacher_for_row(sender, r, sources[i], row, table)  # type: ignore[arg-type]
    return out


def row_loss(logits: torch.Tensor, row: dict[str, list[int]], vocab_size: int, teacher: Teacher | None) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """Summed CE and KD (over response tokens) of one row's logits (T, V), and the count."""
    positions = torch.as_tensor(response_positions(row["labels"]), device=logits.device)
    logp = F.log_softmax(logits[positions - 1, :vocab_size].float(), dim=-1)
    target = torch.as_tensor(row["input_ids"], device=logits.device)[positions]
    ce = -logp.gather(1, target[:, None]).sum()
    kd = None
    if teacher is not None:
        ids, values = (torch.as_tensor(a, device=logits.device) for a in teacher)
        kd = topk_kd(logp, ids, values) * positions.numel()
    return ce, kd, int(positions.numel())


@dataclass(frozen=True)
class DistilSettings:
    """How a receiver trains on the public set."""

    ce_weight: float
    epochs: int
    batch_size: int
    seed: int
    pad_id: int
    vocab_size: int
    #: Device and precision of the training (default: fp32 on the CPU).
    runtime: Runtime = field(default_factory=Runtime)


def distil(
    model: Any, optimizer: torch.optim.Optimizer, rows: Sequence[dict[str, list[int]]],
    teachers_by_row: dict[int, Teacher], settings: DistilSettings,
) -> dict[str, float]:
    """``epochs`` passes of ``lambda * CE + (1 - lambda) * KD`` over the public ``rows``."""
    from fedtune.training.local import batch_indices

    steps = settings.epochs * -(-len(rows) // settings.batch_size)
    torch.manual_seed(settings.seed)
    runtime = settings.runtime
    stepper = runtime.stepper(optimizer)
    model.train()
    forward = runtime.forward(model)
    ce_values: list[float] = []
    kd_values: list[float] = []
    with runtime.adapter_inputs_uncast(model):  # autocast recasts LoRA inputs anyway
        for idx in batch_indices(len(rows), settings.batch_size, steps, settings.seed):
            batch = runtime.batch(collate([rows[i] for i in idx], settings.pad_id))
            with runtime.autocast():
                logits = forward(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            ce_sum = logits.new_zeros((), dtype=torch.float32)
            kd_sum = logits.new_zeros((), dtype=torch.float32)
            ce_n = kd_n = 0
            for b, i in enumerate(idx):
                ce, kd, n = row_loss(logits[b], rows[i], settings.vocab_size, teachers_by_row.get(i))
                ce_sum, ce_n = ce_sum + ce, ce_n + n
                if kd is not None:
                    kd_sum, kd_n = kd_sum + kd, kd_n + n
            ce_mean = ce_sum / max(ce_n, 1)
            kd_mean = kd_sum / max(kd_n, 1)
            loss = weighted_ce_kd(ce_mean, kd_mean, settings.ce_weight)
            optimizer.zero_grad(set_to_none=True)
            stepper.backward(loss)
            stepper.step()
            ce_values.append(float(ce_mean.detach()))
            if kd_n:
                kd_values.append(float(kd_mean.detach()))
    model.eval()
    return {
        "steps": float(steps),
        "ce": float(np.mean(ce_values)) if ce_values else 0.0,
        "kd": float(np.mean(kd_values)) if kd_values else 0.0,
        "kd_rows": float(len(teachers_by_row)),
    }
