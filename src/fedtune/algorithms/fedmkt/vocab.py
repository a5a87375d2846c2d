"""MinED vocabulary mapping between two tokenizers (paper 003, Appendix "Implementation Details
of Token Alignment": building an optimal vocabulary mapping table).

For every source token the table holds the destination token with the same text, else the one
at minimum edit distance, ties to the lexicographically smallest. Token text is compared in a
canonical form so that tokenizers of different families meet:

- a word-initial token starts with ``▁`` (SentencePiece's ``▁``, byte-level BPE's ``Ġ``, a
  WordPiece token without its continuation prefix ``##``); continuation tokens carry nothing;
- byte-level symbols (and SentencePiece's ``<0xNN>`` byte fallbacks) are decoded to the bytes
  they stand for; bytes that are not a whole UTF-8 character become one private-use code
  point each (U+100000 + byte, :func:`decode_bytes`), so a piece of a multi-byte character
  equals no text and the pieces of one character, joined (:func:`join_texts`), equal it;
- both sides pass through the destination's normalizer made idempotent
  (:func:`comparison_normalizer`: BERT's CJK padding and a ``Prepend`` dropped), once each, so
  ``Hello`` finds ``hello`` in an uncased vocabulary at distance 0 and every tokenizer maps
  onto itself as the identity. A text equal before normalising wins over one equal after.

Choices where the paper is silent: a text of whole characters is never mapped onto a token
with a piece of a character (its nearest whole-character token instead: a receiver token that
emits half a character is no counterpart of a word); special tokens map by role (eos to eos, bos to bos, ...)
(eos and sep, bos and cls stand in for each other; a special token
with no counterpart maps to the destination's unk, else its eos) and are never the MinED target
of ordinary text. Special means declared so: a role of the Hugging Face tokenizer, an added
token marked special, or the model's own unk token; their canonical text is None, so
``<unk>`` and ``[UNK]`` meet by role, never by their letters; the lexicographic tie-break compares the
canonical strings (then ids). The search is exact, but pruned: a destination token whose
length differs from the source's by more than the best distance so far cannot win, so lengths
are visited outwards from the source's own and the search stops once no longer length can tie.
Distances are computed by rapidfuzz (C), a block of queries against one length bucket at a time.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

BOUNDARY = "▁"
_ROLES = ("eos_token", "bos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")
#: Where a role is missing on the other side, the role that plays its part (BERT ends with sep).
_STAND_INS = {"eos_token": "sep_token", "sep_token": "eos_token", "bos_token": "cls_token",
              "cls_token": "bos_token"}
_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # SentencePiece's byte fallback pieces
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


_BYTE_BASE = 0x100000  # Supplementary Private Use Area-B: no tokenizer's text uses it
_BYTE_ERRORS = "fedtune-raw-bytes"
_RAW_BYTE = re.compile("[\U00100000-\U001000ff]")


def _raw_bytes(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeDecodeError):
        raise error
    part = error.object[error.start : error.end]
    return "".join(chr(_BYTE_BASE + b) for b in part), error.end


codecs.register_error(_BYTE_ERRORS, _raw_bytes)


def decode_bytes(data: bytes) -> str:
    """UTF-8 text of ``data``; a byte of no whole character becomes U+100000 + byte."""
    return data.decode("utf-8", errors=_BYTE_ERRORS)


def to_bytes(text: str) -> bytes:
    """The bytes ``text`` stands for (the inverse of :func:`decode_bytes`)."""
    if not _RAW_BYTE.search(text):
        return text.encode()
    return b"".join(
        bytes([ord(c) - _BYTE_BASE]) if _BYTE_BASE <= ord(c) < _BYTE_BASE + 256 else c.encode()
        for c in text
    )


def join_texts(texts: Sequence[str]) -> str:
    """Canonical texts concatenated as bytes: the pieces of one character join into it."""
    joined = "".join(texts)
    return decode_bytes(to_bytes(joined)) if _RAW_BYTE.search(joined) else joined


def is_byte_fragment(text: str | None) -> bool:
    """True for a canonical text with a byte that is no whole character."""
    return text is not None and _RAW_BYTE.search(text) is not None


def _idempotent(node: Any) -> Any:
    """A normalizer spec without its parts that change already normalised text."""
    if not isinstance(node, dict):
        return node
    kind = node.get("type")
    if kind == "Prepend":  # Llama's "▁" in front of every text: the marker is handled apart
        return None
    if kind == "BertNormalizer":  # pads CJK characters with spaces: "中" -> " 中 "
        return {**node, "handle_chinese_chars": False}
    if kind == "Sequence":
        parts = [p for p in (_idempotent(n) for n in node.get("normalizers", [])) if p is not None]
        return {**node, "normalizers": parts} if parts else None
    return node


def comparison_normalizer(tokenizer: Any) -> Any:
    """``tokenizer``'s normalizer made idempotent (see the module docstring), or None."""
    return _comparison_normalizer(_backend_spec(tokenizer))


def _comparison_normalizer(spec: dict[str, Any]) -> Any:
    normalizer = _idempotent(spec.get("normalizer"))
    if normalizer is None:
        return None
    from tokenizers import Tokenizer

    bare = {"version": "1.0", "added_tokens": [], "normalizer": normalizer,
            "model": {"type": "WordLevel", "vocab": {}, "unk_token": "<unk>"}}
    return Tokenizer.from_str(json.dumps(bare)).normalizer


def canonical_tokens(tokenizer: Any, normalizer: Any = None) -> list[str | None]:
    """The canonical text of every id below ``len(tokenizer)`` (None for ids with no token and
    for special tokens).

    Args:
        tokenizer: Any Hugging Face tokenizer (fast ones are read from their backend spec;
            slow ones through ``convert_tokens_to_string``).
        normalizer: A ``tokenizers`` normalizer applied once to each token's text after its
            word-start marker (:func:`comparison_normalizer` of either side).
    """
    return _format(_pieces(tokenizer, _backend_spec(tokenizer)), normalizer)


Piece = tuple[bool, str, bool]  # (word start, text after the marker, byte fallback piece)


def _format(pieces: Sequence[Piece | None], normalizer: Any) -> list[str | None]:
    out: list[str | None] = []
    for piece in pieces:
        if piece is None:
            out.append(None)
            continue
        start, body, _ = piece
        body = normalizer.normalize_str(body) if normalizer is not None else body
        out.append((BOUNDARY + body) if start else body)
    return out


def _pieces(tokenizer: Any, spec: dict[str, Any]) -> list[Piece | None]:
    model = spec.get("model") or {}
    byte_level = _mentions(spec.get("pre_tokenizer"), "ByteLevel") or _mentions(spec.get("decoder"), "ByteLevel")
    prefix = model.get("continuing_subword_prefix") if model.get("type") == "WordPiece" else None
    suffix = model.get("end_of_word_suffix")
    decode = _byte_decoder() if byte_level else None
    fallback = bool(model.get("byte_fallback"))
    special = _special_ids(tokenizer, spec)
    out: list[Piece | None] = [None] * len(tokenizer)
    for token, index in tokenizer.get_vocab().items():
        if not 0 <= index < len(out) or index in special:
            continue
        text = _text(token, decode, fallback, tokenizer)
        if prefix:
            text = text[len(prefix):] if text.startswith(prefix) else " " + text
        if suffix and text.endswith(suffix):
            text = text[: -len(suffix)]
        start = text.startswith(" ")
        out[index] = (start, text[1:] if start else text, fallback and bool(_BYTE_PIECE.fullmatch(token)))
    return out


def _text(token: str, decode: dict[str, int] | None, fallback: bool, tokenizer: Any) -> str:
    """The text a vocabulary entry stands for, a leading space for a word start."""
    if decode is not None and all(c in decode for c in token):
        return decode_bytes(bytes(decode[c] for c in token))
    if fallback and _BYTE_PIECE.fullmatch(token):
        return decode_bytes(bytes([int(token[3:5], 16)]))
    if decode is None and not _backend_spec_known(tokenizer):
        text = str(tokenizer.convert_tokens_to_string([token]))
        return (" " + text) if token[:1] in ("▁", "Ġ") and not text.startswith(" ") else text
    return token.replace(BOUNDARY, " ")


def _backend_spec_known(tokenizer: Any) -> bool:
    return getattr(tokenizer, "backend_tokenizer", None) is not None


def _model_unk_id(tokenizer: Any, spec: dict[str, Any] | None = None) -> int | None:
    """The id of the unk token the backend model emits (it may carry no Hugging Face role)."""
    unk = ((_backend_spec(tokenizer) if spec is None else spec).get("model") or {}).get("unk_token")
    index = tokenizer.get_vocab().get(unk) if isinstance(unk, str) else None
    return int(index) if index is not None else None


def _special_ids(tokenizer: Any, spec: dict[str, Any]) -> set[int]:
    """Declared special tokens: Hugging Face roles, added tokens marked special, the model's unk."""
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", []) if i is not None and i >= 0}
    ids.update(int(t["id"]) for t in spec.get("added_tokens", []) if t.get("special"))
    unk = _model_unk_id(tokenizer, spec)
    return ids | ({unk} if unk is not None else set())


def content_hash(tokenizer: Any) -> str:
    """sha256 of what decides the mapping: the backend spec (or vocabulary) and special tokens."""
    spec = _backend_spec(tokenizer)
    body = spec if spec else {"vocab": sorted(tokenizer.get_vocab().items())}
    roles = {role: getattr(tokenizer, role, None) for role in _ROLES}
    payload = json.dumps([body, roles, len(tokenizer)], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


def map_vocabulary(src_tokenizer: Any, dst_tokenizer: Any) -> np.ndarray:
    """A dst token id for every src id (``len(src_tokenizer)`` int64 entries), by MinED.

    The same canonical text before normalising, else after, else minimum Levenshtein
    distance, ties to the lexicographically smallest canonical dst text. Special tokens map
    by role.
    """
    src_spec, dst_spec = _backend_spec(src_tokenizer), _backend_spec(dst_tokenizer)
    src_pieces, dst_pieces = _pieces(src_tokenizer, src_spec), _pieces(dst_tokenizer, dst_spec)
    norm = _comparison_normalizer(dst_spec)
    src, dst = _format(src_pieces, norm), _format(dst_pieces, norm)
    src_raw, dst_raw = _exact_keys(src_pieces), _exact_keys(dst_pieces)
    raw_first, first, buckets = _candidates(dst, dst_raw)
    fallback = _role_id(dst_tokenizer, "unk_token")
    if fallback is None:
        fallback = _role_id(dst_tokenizer, "eos_token") or 0
    table = np.full(len(src), fallback, dtype=np.int64)

    pending: dict[tuple[int, bool], list[int]] = defaultdict(list)  # (length, fragment) -> src ids
    src_special = _special_ids(src_tokenizer, src_spec)
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
        key = src_raw[index]
        hit = raw_first.get(key) if key is not None else None
        hit = first.get(text) if hit is None else hit
        if hit is not None:
            table[index] = hit
        else:
            pending[(len(text), is_byte_fragment(text))].append(index)
    for (length, fragment), ids in pending.items():
        _nearest(ids, [str(src[i]) for i in ids], length, buckets[fragment], first, table)
    return table


Buckets = dict[bool, dict[int, list[str]]]  # fragments allowed -> length -> sorted texts


def _candidates(
    dst: Sequence[str | None], dst_raw: Sequence[tuple[str, bool] | None]
) -> tuple[dict[tuple[str, bool], int], dict[str, int], Buckets]:
    """The first dst id per text before and after normalising (byte fallbacks after pieces,
    specials never), and the MinED candidates by length: text of whole characters never goes
    to a piece of one."""
    raw_first: dict[tuple[str, bool], int] = {}
    for index, key in enumerate(dst_raw):
        if key is not None:
            raw_first.setdefault(key, index)
    first: dict[str, int] = {}
    for fallback_pass in (False, True):
        for index, text in enumerate(dst):
            key = dst_raw[index]
            if key is not None and key[1] == fallback_pass and text and text not in first:
                first[text] = index
    buckets: Buckets = {True: defaultdict(list), False: defaultdict(list)}
    for text in first:
        buckets[True][len(text)].append(text)
        if not is_byte_fragment(text):
            buckets[False][len(text)].append(text)
    for by_length in buckets.values():
        for texts in by_length.values():
            texts.sort()
    return raw_first, first, buckets


def _exact_keys(pieces: Sequence[Piece | None]) -> list[tuple[str, bool] | None]:
    """Per id, its text before normalising (marker included) and whether it is a byte fallback."""
    return [None if p is None else ((BOUNDARY if p[0] else "") + p[1], p[2]) for p in pieces]


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
    if isinstance(value, int) and value >= 0:
        return int(value)
    return _model_unk_id(tokenizer) if role == "unk_token" else None


#: The version names the mapping rules: a table cached by older rules is not read back.
VOCAB_CACHE_PREFIX = "fedmkt/vocab-map-v2-"


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
