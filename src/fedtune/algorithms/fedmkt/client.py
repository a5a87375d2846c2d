"""FedMKT's tenant side (paper 003, Algorithm 1, client part): distil the LLM's knowledge of
the previous round into the tenant's own small model (DualMinCE-selected, aligned into its
vocabulary), fine-tune on the private data, and compute the small model's knowledge on the
public set, which is all that leaves.

The LLM -> SLM vocabulary table and the alignments are computed once and kept, with the
adapter, in the tenant's client state (its own store).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedtune.algorithms.fedmkt import transfer
from fedtune.algorithms.fedmkt.knowledge import Knowledge
from fedtune.algorithms.fedmkt.select import ce_by_sample, dual_min_ce
from fedtune.algorithms.fedmkt.vocab import (
    VOCAB_CACHE_PREFIX,
    canonical_tokens,
    content_hash,
    map_vocabulary,
)

CACHE = "cache/"


def restore_cache(state_tensors: dict[str, torch.Tensor]) -> transfer.DictCache:
    """The tables and alignments kept in the client state (``cache/<key>/<name>``)."""
    entries: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in state_tensors.items():
        if name.startswith(CACHE):
            key, _, field = name[len(CACHE) :].rpartition("/")
            entries.setdefault(key, {})[field] = tensor
    return transfer.DictCache(entries)


def cache_tensors(cache: transfer.DictCache) -> dict[str, torch.Tensor]:
    """The cache as client-state tensors."""
    return {f"{CACHE}{key}/{field}": t for key, fields in cache.entries.items() for field, t in fields.items()}


def vocabulary_table(cache: transfer.DictCache, llm_tokenizer: Any, own_tokenizer: Any) -> np.ndarray:
    """LLM -> SLM MinED table, from the cache or computed once."""
    # The mapping rules' version is in the prefix: a table kept under older rules is not read.
    key = f"{VOCAB_CACHE_PREFIX}{content_hash(llm_tokenizer)[:20]}-{content_hash(own_tokenizer)[:20]}"
    found = cache.load(key)
    if found is None:
        found = {"map": torch.from_numpy(map_vocabulary(llm_tokenizer, own_tokenizer).astype(np.int32))}
        cache.save(key, found)
    return found["map"].numpy().astype(np.int64)


def selected_teachers(
    cache: transfer.DictCache,
    own_side: transfer.Side,
    own_ce: np.ndarray,
    llm: Knowledge,
    llm_tokenizer: Any,
    own_tokenizer: Any,
    public_hash: str,
    n_public: int,
) -> dict[int, transfer.Teacher]:
    """DualMinCE with the LLM as the only sender, then the chosen samples' aligned teachers."""
    own = ce_by_sample(own_side.samples, own_ce, n_public)
    chosen = dual_min_ce(own, ce_by_sample(llm.sample, llm.ce, n_public)[None])
    table = vocabulary_table(cache, llm_tokenizer, own_tokenizer)
    llm_side = transfer.Side(canonical_tokens(llm_tokenizer), [], np.zeros(0), content_hash(llm_tokenizer))
    sources = transfer.alignment(llm, llm_side, own_side, public_hash, cache)
    return transfer.teachers(llm, chosen, sources, own_side, table, 0)
