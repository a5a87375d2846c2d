"""What a FedMKT tenant caches in its kept state is keyed by the version of the rules that made it."""

from __future__ import annotations

from fedtune.algorithms.fedmkt import client, transfer
from fedtune.algorithms.fedmkt.vocab import VOCAB_CACHE_PREFIX
from fedtune.models.tokenizer import load_tokenizer


def test_a_vocabulary_table_kept_by_a_tenant_names_the_mapping_rules() -> None:
    tokenizer = load_tokenizer("builtin")
    cache = transfer.DictCache({})
    table = client.vocabulary_table(cache, tokenizer, tokenizer)
    assert list(cache.entries) and all(k.startswith(VOCAB_CACHE_PREFIX) for k in cache.entries)
    assert (table == list(range(len(tokenizer)))).all()  # a tokenizer onto itself: identity
    # Read back under the same rules, not recomputed.
    assert (client.vocabulary_table(cache, tokenizer, tokenizer) == table).all()


def test_alignment_cache_keys_name_the_alignment_rules() -> None:
    assert transfer.ALIGN_CACHE_PREFIX.startswith("fedmkt/align-v")
    assert VOCAB_CACHE_PREFIX.startswith("fedmkt/vocab-map-v")
