"""FedMKT's provider side (paper 003, Algorithm 1, server part; Appendix A workflow steps 4-7):
align every tenant's knowledge into the LLM's vocabulary, select by DualMinCE, distil into the
LLM, and compute the LLM's knowledge for the next broadcast.

Tenants' tokenizers are read from the job (they are declared public); the vocabulary tables
(tenant -> LLM) and the alignments are computed once and cached in the provider's store.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fedtune.algorithms.fedmkt import transfer
from fedtune.algorithms.fedmkt.knowledge import Knowledge, check_top_k
from fedtune.algorithms.fedmkt.select import ce_by_sample, dual_min_ce
from fedtune.algorithms.fedmkt.vocab import cached_mapping, canonical_tokens, content_hash
from fedtune.core.errors import ConfigError, FedtuneError


def tenant_tokenizer(tenant: str, spec: str, top_k: int) -> Any:
    """Load a tenant's tokenizer and check top-k fits its vocabulary.

    Raises:
        ConfigError: The tokenizer cannot be loaded, or top_k exceeds its vocabulary.
    """
    from fedtune.models.tokenizer import load_tokenizer

    try:
        tokenizer = load_tokenizer(spec)
    except FedtuneError as exc:
        raise ConfigError(
            f"tenant {tenant!r}: its tokenizer {spec!r} cannot be loaded: {exc}",
            fix=f"Set tenants[{tenant}].tokenizer to 'builtin' or a directory written by "
            "save_pretrained (tokenizer.json) that the provider can read.",
        ) from exc
    check_top_k(top_k, len(tokenizer), f"tenant {tenant!r}'s tokenizer {spec!r}")
    return tokenizer


def selected_teachers(
    store: Any,
    llm_side: transfer.Side,
    llm_ce: np.ndarray,
    updates: Mapping[str, Knowledge],
    tokenizers: Mapping[str, Any],
    llm_tokenizer: Any,
    public_hash: str,
    n_public: int,
) -> tuple[dict[int, transfer.Teacher], dict[str, float]]:
    """DualMinCE over the tenants (sorted by name), then each chosen sample's aligned teacher."""
    names = sorted(updates)
    own = ce_by_sample(llm_side.samples, llm_ce, n_public)
    senders = np.stack([ce_by_sample(updates[n].sample, updates[n].ce, n_public) for n in names])
    chosen = dual_min_ce(own, senders)
    cache = transfer.StoreCache(store)
    out: dict[int, transfer.Teacher] = {}
    metrics: dict[str, float] = {}
    for index, name in enumerate(names):
        tok = tokenizers[name]
        table, _ = cached_mapping(store, tok, llm_tokenizer)
        sender_side = transfer.Side(canonical_tokens(tok), [], np.zeros(0), content_hash(tok))
        sources = transfer.alignment(updates[name], sender_side, llm_side, public_hash, cache)
        picked = transfer.teachers(updates[name], chosen, sources, llm_side, table, index)
        out.update(picked)
        metrics[f"fedmkt/llm_selected/{name}"] = float(len(picked))
    metrics["fedmkt/llm_selected"] = float(len(out))
    metrics["fedmkt/cache_hits"] = float(cache.hits)
    return out, metrics
