"""MinED vocabulary mapping between two tokenizers (paper 003, Appendix "Implementation Details
of Token Alignment": building an optimal vocabulary mapping table).

For every source token the table holds the destination token with the same text, else the one
at minimum edit distance, ties to the lexicographically smallest. Token text is compared in a
canonical form so that tokenizers of different families meet:

- a word-initial token starts with ``▁`` (SentencePiece's ``▁``, byte-level BPE's ``Ġ``, a
  WordPiece token without its continuation prefix ``##``); continuation tokens carry nothing;
- byte-level symbols are decoded to the text they stand for (a piece of a multi-byte
  character as ``\\xNN`` escapes, so distinct pieces stay distinct and equal pieces match);
- source text passes through the destination's normalizer (e.g. BERT's lowercasing), so
  ``Hello`` finds ``hello`` in an uncased vocabulary at distance 0, not 1.

Choices where the paper is silent: special tokens map by role (eos to eos, bos to bos, ...)
(eos and sep, bos and cls stand in for each other; a special token
with no counterpart maps to the destination's unk, else its eos) and are never the MinED target
of ordinary text; the lexicographic tie-break compares the
canonical strings (then ids). The search is exact, but pruned: a destination token whose
length differs from the source's by more than the best distance so far cannot win, so lengths
are visited outwards from the source's own and the search stops once no longer length can tie.
Distances are computed by rapidfuzz (C), a block of queries against one length bucket at a time.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from typing import Any

import numpy as np

BOUNDARY = "▁"
_ROLES = ("eos_token", "bos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")
#: Where a role is missing on the other side, the role that plays its part (BERT ends with sep).
_STAND_INS = {"eos_token": "sep_token", "sep_token": "eos_token", "bos_token": "cls_token",
              "cls_token": "bos_token"}
_BLOCK = 2048  # queries per rapidfuzz call: bounds memory at _BLOCK x bucket int32


def _backend_spec(tokenizer: Any) -> dict[str, Any]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return json.loads(backend.to_str()) if backend is not None else {}


def _mentions(node: Any, kind: str) -> bool:
    """True when a (nested) pre-tokenizer/decoder spec has a component of type ``kind``."""
    if isinstance(node, dict):
        return node.get("type") == kind or any(_mentions(v, kind) for v in node.values())
    if isinstance(node, list):
        return any(_mentions(v, kind) for v in node)
    return False


def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's printable byte alphabet (bytes_to_unicode)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(keep)
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


def canonical_tokens(tokenizer: Any, normalizer: Any = None) -> list[str | None]:
    """The canonical text of every id below ``len(tokenizer)`` (None for ids with no token).

    Args:
        tokenizer: Any Hugging Face tokenizer (fast ones are read from their backend spec;
            slow ones through ``convert_tokens_to_string``).
        normalizer: A ``tokenizers`` normalizer applied to each token's text (the other side's).
    """
    spec = _backend_spec(tokenizer)
    model = spec.get("model") or {}
    byte_level = _mentions(spec.get("pre_tokenizer"), "ByteLevel") or _mentions(spec.get("decoder"), "ByteLevel")
    prefix = model.get("continuing_subword_prefix") if model.get("type") == "WordPiece" else None
    suffix = model.get("end_of_word_suffix")
    decode = _byte_decoder() if byte_level else None
    out: list[str | None] = [None] * len(tokenizer)
    for token, index in tokenizer.get_vocab().items():
        if not 0 <= index < len(out):
            continue
        out[index] = _canonical(token, decode, prefix, suffix, tokenizer, normalizer)
    return out


def _canonical(
    token: str, decode: dict[str, int] | None, prefix: str | None, suffix: str | None,
    tokenizer: Any, normalizer: Any,
) -> str:
    if decode is not None and all(c in decode for c in token):
        text = bytes(decode[c] for c in token).decode("utf-8", errors="backslashreplace")
    elif decode is None and not _backend_spec_known(tokenizer):
        text = str(tokenizer.convert_tokens_to_string([token]))
        text = (" " + text) if token[:1] in ("▁", "Ġ") and not text.startswith(" ") else text
    else:
        text = token.replace(BOUNDARY, " ")
    if prefix:
        text = text[len(prefix):] if text.startswith(prefix) else " " + text
    if suffix and text.endswith(suffix):
        text = text[: -len(suffix)]
    if normalizer is not None:
        text = normalizer.normalize_str(text)
    return (BOUNDARY + text[1:]) if text.startswith(" ") else text


def _backend_spec_known(tokenizer: Any) -> bool:
    return getattr(tokenizer, "backend_tokenizer", None) is not None


def _special_ids(tokenizer: Any) -> set[int]:
    return {int(i) for i in getattr(tokenizer, "all_special_ids", []) if i is not None and i >= 0}


def content_hash(tokenizer: Any) -> str:
    """sha256 of what decides the mapping: the backend spec (or vocabulary) and special tokens."""
    spec = _backend_spec(tokenizer)
    body = spec if spec else {"vocab": sorted(tokenizer.get_vocab().items())}
    roles = {role: getattr(tokenizer, role, None) for role in _ROLES}
    payload = json.dumps([body, roles, len(tokenizer)], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


def map_vocabulary(src_tokenizer: Any, dst_tokenizer: Any) -> np.ndarray:
    """A dst token id for every src id (``len(src_tokenizer)`` int64 entries), by MinED.

    Exact canonical match first, else minimum Levenshtein distance, ties to the
    lexicographically smallest canonical dst text. Special tokens map by role.
    """
    dst_spec = _backend_spec(dst_tokenizer).get("normalizer")
    dst_norm = dst_tokenizer.backend_tokenizer.normalizer if dst_spec else None
    src = canonical_tokens(src_tokenizer, dst_norm)
    dst = canonical_tokens(dst_tokenizer)
    dst_special = _special_ids(dst_tokenizer)
    fallback = _role_id(dst_tokenizer, "unk_token")
    if fallback is None:
        fallback = _role_id(dst_tokenizer, "eos_token") or 0
    table = np.full(len(src), fallback, dtype=np.int64)

    # dst candidates: first id per canonical text, specials excluded.
    first: dict[str, int] = {}
    for index, text in enumerate(dst):
        if text is not None and text != "" and index not in dst_special and text not in first:
            first[text] = index
    buckets: dict[int, list[str]] = defaultdict(list)
    for text in first:
        buckets[len(text)].append(text)
    for texts in buckets.values():
        texts.sort()

    pending: dict[int, list[int]] = defaultdict(list)  # query length -> src ids
    src_special = _special_ids(src_tokenizer)
    for index, text in enumerate(src):
        if index in src_special:
            role = _role_of(src_tokenizer, index)
            mapped = _role_id(dst_tokenizer, role) if role else None
            if mapped is None and role in _STAND_INS:
                mapped = _role_id(dst_tokenizer, _STAND_INS[role])
            table[index] = fallback if mapped is None else mapped
            continue
        if text is None or text == "":
            continue
        hit = first.get(text)
        if hit is not None:
            table[index] = hit
        else:
            pending[len(text)].append(index)
    for length, ids in pending.items():
        _nearest(ids, [src[i] for i in ids], length, buckets, first, table)  # type: ignore[misc]
    return table


def _nearest(
    ids: list[int], texts: list[str], length: int, buckets: dict[int, list[str]],
    first: dict[str, int], table: np.ndarray,
) -> None:
    """Fill ``table[ids]`` with the MinED dst id of each text (all of the same ``length``)."""
    from rapidfuzz.distance import Levenshtein
    from rapidfuzz.process import cdist

    if not buckets:
        return
    n = len(texts)
    best = np.full(n, np.iinfo(np.int32).max, dtype=np.int64)
    best_text: list[str | None] = [None] * n
    max_len = max(buckets)
    for diff in range(0, max(length, max_len) + 1):
        open_rows = np.nonzero(best >= diff)[0]  # rows a distance >= diff may still tie
        if open_rows.size == 0:
            break
        for size in sorted({length - diff, length + diff}):
            choices = buckets.get(size)
            if not choices:
                continue
            for start in range(0, open_rows.size, _BLOCK):
                rows = open_rows[start : start + _BLOCK]
                cutoff = int(min(best[rows].max(), length + size))
                dist = cdist(
                    [texts[r] for r in rows], choices, scorer=Levenshtein.distance,
                    score_cutoff=cutoff, dtype=np.int32, workers=1,
                )
                col = dist.argmin(axis=1)  # first minimum: the smallest text of this bucket
                _merge(rows, dist, col, choices, best, best_text)
    for r, text in enumerate(best_text):
        if text is not None:
            table[ids[r]] = first[text]


def _merge(
    rows: np.ndarray, dist: np.ndarray, col: np.ndarray, choices: list[str],
    best: np.ndarray, best_text: list[str | None],
) -> None:
    """Keep, per row, the smaller distance; on a tie the lexicographically smaller text."""
    found = dist[np.arange(rows.size), col]
    for k, r in enumerate(rows.tolist()):
        d, text = int(found[k]), choices[int(col[k])]
        current = best_text[r]
        if d < best[r] or (d == best[r] and current is not None and text < current):
            best[r] = d
            best_text[r] = text


def _role_of(tokenizer: Any, index: int) -> str | None:
    for role in _ROLES:
        if _role_id(tokenizer, role) == index:
            return role
    return None


def _role_id(tokenizer: Any, role: str) -> int | None:
    value = getattr(tokenizer, f"{role}_id", None)
    return int(value) if isinstance(value, int) and value >= 0 else None


VOCAB_CACHE_PREFIX = "fedmkt/vocab-map-"


def mapping_key(src_tokenizer: Any, dst_tokenizer: Any) -> str:
    """Store key of the src -> dst table: both tokenizers' content hashes."""
    return f"{VOCAB_CACHE_PREFIX}{content_hash(src_tokenizer)[:20]}-{content_hash(dst_tokenizer)[:20]}.safetensors"


def cached_mapping(store: Any, src_tokenizer: Any, dst_tokenizer: Any) -> tuple[np.ndarray, bool]:
    """:func:`map_vocabulary` through ``store`` (computed once per tokenizer pair).

    Returns the table and whether it came from the store. With ``store`` None it is computed.
    """
    import torch

    key = mapping_key(src_tokenizer, dst_tokenizer)
    if store is not None and store.exists(key):
        return store.get_tensors(key)["map"].numpy().astype(np.int64), True
    table = map_vocabulary(src_tokenizer, dst_tokenizer)
    if store is not None:
        store.put_tensors(key, {"map": torch.from_numpy(table.astype(np.int32))})
    return table, False
