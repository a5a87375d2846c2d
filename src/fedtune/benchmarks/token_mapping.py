"""FedMKT's token mapping and alignment measured on four tokenizer families (issue 29).

For every ordered pair among all-MiniLM-L6-v2's WordPiece, a GPT-2-style byte-level BPE, a
SentencePiece-style ("▁") BPE and the builtin 1,024-token byte-level BPE:

- **identity**: the share of ids a tokenizer's mapping onto itself keeps (goal 100 %);
- **word -> fragment/special**: word tokens (letters or digits, 2+ characters) whose MinED
  target is a byte piece of no whole character or a special token (goal 0);
- **exact matches kept**: on :data:`SENTENCES` (accents, CJK, emoji), a receiver token whose
  text span is exactly covered by sender tokens (one, or several that no other receiver token
  shares) with the same text is an exact match; the share of them the alignment pairs with
  the first of those sender tokens (goal 100 %);
- mapping and alignment time (wall and CPU seconds of this process).

Spans come from the tokenizers' own offsets, so the reference does not depend on the
alignment under test. ``fedtune bench token-mapping --record docs/results/fedmkt-token-
mapping.json`` writes the JSON; :func:`token_mapping_markdown` renders the docs table.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import numpy as np

# The FedMKT modules are imported where used: the docs renderer needs none of them.

__all__ = [
    "SENTENCES",
    "exact_matches",
    "family_tokenizers",
    "run_token_mapping",
    "token_mapping_markdown",
    "word_fragment_hits",
]

#: The fixed sentences of the alignment figures (accents, CJK, emoji, digits).
SENTENCES: Final[tuple[str, ...]] = (
    "We utilize the dynamic programming approach to align tokens.",
    "The café on Rue de Rivoli serves crème brûlée and a naïve piña colada.",
    "Zürich, São Paulo and Kraków hosted the 1999 conference.",
    "東京は日本の首都です。北京是中国的首都。",
    "서울에서 만나요! See you in Seoul.",
    "Knowledge transfer 🤖 between large and small models works 👍🏽 well.",
    "Emoji sequences like 👨‍👩‍👧 or 🇫🇷 are several code points.",
    "Programming languages: Python, Rust, Go — and über-long compound words.",
    "Ελληνικά και русский текст рядом с English words.",
    "Mixed 中文 and English: 机器学习 (machine learning) is popular.",
    "Prices rose 12.5% to €1,234 in Q3; see area 51 for details.",
    "Below is an instruction that describes a task. Write a response.",
)
_ENGLISH: Final = (
    "we need to see the area where the dynamic programming approach aligns tokens",
    "the quick brown fox jumps over the lazy dog in the year 1999",
    "knowledge transfer between large and small language models needs a shared vocabulary",
)
FAMILIES: Final = ("minilm-wordpiece", "bytelevel-bpe", "sentencepiece-bpe", "builtin")


def training_texts() -> list[str]:
    """What the trained tokenizers learn on: the sentences and some English, repeated."""
    return [*SENTENCES, *_ENGLISH] * 8


def family_tokenizers(bytelevel_size: int = 800, sentencepiece_size: int = 600) -> dict[str, Any]:
    """The four tokenizers by :data:`FAMILIES` name (the two BPEs trained here, offline)."""
    from fedtune.benchmarks.vocabularies import pretrain_tokenizer
    from fedtune.models.tokenizer import load_tokenizer, train_tokenizer
    from fedtune.models.tokenizer_families import metaspace_bpe

    texts = training_texts()
    return {
        "minilm-wordpiece": pretrain_tokenizer("minilm-wordpiece", []),
        "bytelevel-bpe": train_tokenizer(texts, bytelevel_size),
        "sentencepiece-bpe": metaspace_bpe(texts, sentencepiece_size),
        "builtin": load_tokenizer("builtin"),
    }


_CANON: dict[tuple[int, int], tuple[Any, Any, list[str | None]]] = {}


def _canonical(tok: Any, normalised_as: Any = None) -> list[str | None]:
    """``tok``'s canonical texts, normalised with ``normalised_as``'s comparison normalizer,
    computed once per pair of objects (the entry holds both, so their ids stay theirs)."""
    from fedtune.algorithms.fedmkt.vocab import canonical_tokens, comparison_normalizer

    key = (id(tok), id(normalised_as))
    if key not in _CANON:
        norm = comparison_normalizer(normalised_as) if normalised_as is not None else None
        _CANON[key] = (tok, normalised_as, canonical_tokens(tok, norm))
    return _CANON[key][2]


def _bare(text: str | None) -> str:
    from fedtune.algorithms.fedmkt.vocab import BOUNDARY

    return (text or "").replace(BOUNDARY, "").strip()


def word_fragment_hits(src: Any, dst: Any, table: np.ndarray) -> tuple[int, list[tuple[str, str | None]]]:
    """How many word tokens of ``src`` the ``table`` sends onto a byte fragment or a special
    token of ``dst``, and those (source text, target text) pairs."""
    from fedtune.algorithms.fedmkt.vocab import is_byte_fragment

    src_canon, dst_canon = _canonical(src), _canonical(dst)
    words, hits = 0, []
    for index, text in enumerate(src_canon):
        word = _bare(text)
        if len(word) < 2 or not word.isalnum() or is_byte_fragment(word):
            continue
        words += 1
        target = dst_canon[int(table[index])]
        if target is None or is_byte_fragment(target):
            hits.append((word, target))
    return words, hits


def _spans(tok: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids and their character spans with surrounding whitespace trimmed."""
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = []
    for start, end in enc["offset_mapping"]:
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        spans.append((start, end))
    return list(enc["input_ids"]), spans


def exact_matches(
    src: Any, dst: Any, sentences: Sequence[str] = SENTENCES,
    aligner: Callable[[list[str | None], list[str | None]], list[tuple[int, int]]] | None = None,
) -> tuple[int, list[tuple[str, str, str]], float]:
    """Exact matches of ``src`` -> ``dst`` on ``sentences`` (see the module docstring): their
    count, the ones ``aligner`` (default :func:`~fedtune.algorithms.fedmkt.align.align_tokens`)
    loses (sentence, sender text, receiver text), and the CPU seconds it took."""
    from fedtune.algorithms.fedmkt.align import align_tokens
    from fedtune.algorithms.fedmkt.vocab import join_texts

    aligner = aligner or align_tokens
    src_canon, dst_canon = _canonical(src), _canonical(dst)
    src_norm, dst_norm = _canonical(src, dst), _canonical(dst, dst)
    total, lost, seconds = 0, [], 0.0
    for sentence in sentences:
        s_ids, s_spans = _spans(src, sentence)
        d_ids, d_spans = _spans(dst, sentence)
        started = time.process_time()
        pairs = set(aligner([src_canon[t] for t in s_ids], [dst_canon[t] for t in d_ids]))
        seconds += time.process_time() - started
        for j, (start, end) in enumerate(d_spans):
            if start == end or dst_norm[d_ids[j]] is None:
                continue
            inside = [i for i, (s, e) in enumerate(s_spans) if s < end and e > start and s < e]
            shared = [k for k, (s, e) in enumerate(d_spans) if k != j and s < end and e > start]
            if not inside or shared or any(s_spans[i][0] < start or s_spans[i][1] > end for i in inside):
                continue
            if min(s_spans[i][0] for i in inside) != start or max(s_spans[i][1] for i in inside) != end:
                continue
            texts = [src_norm[s_ids[i]] for i in inside]
            if any(t is None for t in texts) or _bare(join_texts([_bare(t) for t in texts])) != _bare(dst_norm[d_ids[j]]):  # type: ignore[misc]
                continue
            total += 1
            if (inside[0], j) not in pairs:
                lost.append((sentence, "+".join(_bare(t) for t in texts), _bare(dst_norm[d_ids[j]])))  # type: ignore[misc]
    return total, lost, seconds


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def run_token_mapping(log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every figure of the module docstring for every ordered pair of :data:`FAMILIES`."""
    from fedtune.algorithms.fedmkt.vocab import map_vocabulary

    toks = family_tokenizers()
    pairs = []
    for src_name in FAMILIES:
        for dst_name in FAMILIES:
            src, dst = toks[src_name], toks[dst_name]
            table, wall, cpu = _timed(functools.partial(map_vocabulary, src, dst))
            words, hits = word_fragment_hits(src, dst, table)
            total, lost, align_cpu = exact_matches(src, dst)
            row = {
                "src": src_name, "dst": dst_name, "map_s": wall, "map_cpu_s": cpu,
                "word_tokens": words, "word_to_fragment_or_special": len(hits),
                "examples": [f"{w} -> {t!r}" for w, t in hits[:5]],
                "exact_matches": total, "exact_kept": total - len(lost), "align_cpu_s": align_cpu,
                "lost": [f"{s} / {r}" for _, s, r in lost[:5]],
            }
            if src_name == dst_name:
                row["identity"] = float(np.mean(table == np.arange(len(table))))
            pairs.append(row)
            log(f"{src_name} -> {dst_name}: {row['exact_kept']}/{total} exact kept, "
                f"{len(hits)}/{words} words onto fragments/specials, {cpu:.2f} CPU s mapping")
    return {
        "tokenizers": {name: len(tok) for name, tok in toks.items()},
        "sentences": list(SENTENCES),
        "pairs": pairs,
    }


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "-"


def token_mapping_markdown(results: Mapping[str, Any]) -> str:
    """The figures of :func:`run_token_mapping` as a Markdown table."""
    sizes = results["tokenizers"]
    device = results.get("device") or {}
    lines = [
        f"Tokenizers: {', '.join(f'{name} ({size:,} tokens)' for name, size in sizes.items())}; "
        f"{len(results['sentences'])} sentences; {device.get('description', 'unknown device')}, "
        "one process, CPU seconds of that process.",
        "",
        "| sender -> receiver | identity | words -> fragment/special | exact matches kept | "
        "mapping, CPU | alignment, CPU |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for p in results["pairs"]:
        identity = f"{100 * p['identity']:.2f} %" if "identity" in p else ""
        lines.append(
            f"| {p['src']} -> {p['dst']} | {identity} | {p['word_to_fragment_or_special']} of "
            f"{p['word_tokens']:,} | {p['exact_kept']} of {p['exact_matches']} "
            f"({_pct(p['exact_kept'], p['exact_matches'])}) | {p['map_cpu_s']:.2f} s | "
            f"{p['align_cpu_s']:.3f} s |"
        )
    return "\n".join(lines) + "\n"
