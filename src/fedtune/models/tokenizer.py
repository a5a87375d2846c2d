"""Offline tokenizers: train a small byte-level BPE, or load the shipped one or a HF directory.

Byte-level BPE maps every string to tokens without an unknown token and decodes back to the
exact same string, which the evaluation code relies on (Rouge-L, exact match on decoded text).
Digits are split one per token. Special tokens take the first ids: ``<pad>`` = 0, ``<s>`` = 1,
``</s>`` = 2. The tokenizer adds no special tokens by itself; the data code puts ``</s>`` after
each response where it wants one.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from fedtune.core.errors import DataError, ModelError
from fedtune.data.jsonl import iter_jsonl

logger = logging.getLogger(__name__)

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS)
BUILTIN = "builtin"
# Written beside the shipped tokenizer by scripts/build_tokenizer.py: what it was trained on.
INFO_FILE = "fedtune_tokenizer.json"
# 256 byte symbols + the special tokens: below this a byte-level BPE cannot exist.
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)

# Fields of instruction-tuning records whose text the model reads or writes (Alpaca, Dolly,
# GSM8K and question-answer layouts).
TEXT_FIELDS: tuple[str, ...] = (
    "instruction",
    "input",
    "context",
    "output",
    "response",
    "question",
    "answer",
)
# The Alpaca-style prompt text (FedBiOT Appendix D) that precedes every example; training on it
# gives it short token sequences, so prompts do not eat the tiny models' context.
PROMPT_TEMPLATE_TEXTS: tuple[str, ...] = (
    (
        "Below is an instruction that describes a task, paired with an input that provides"
        " further context. Write a response that appropriately completes the request.\n\n"
        "### Instruction:\n\n\n### Input:\n\n\n### Response:\n"
    ),
    (
        "Below is an instruction that describes a task. Write a response that appropriately"
        " completes the request.\n\n### Instruction:\n\n\n### Response:\n"
    ),
    "The answer is ",
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts``.

    Args:
        texts: Training strings; read once.
        vocab_size: Upper bound of the vocabulary, special tokens included. A small corpus can
            yield fewer tokens; ``len(tokenizer)`` is the real size.

    Returns:
        A fast tokenizer with ``pad``/``bos``/``eos`` set and no automatic special tokens.

    Raises:
        ModelError: ``vocab_size`` is below the 259 a byte-level vocabulary needs.
    """
    if vocab_size < MIN_VOCAB_SIZE:
        raise ModelError(
            f"tokenizer vocab_size={vocab_size} is too small for a byte-level BPE",
            fix=f"Use a vocab_size of at least {MIN_VOCAB_SIZE} (256 bytes + 3 special tokens).",
        )
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            # One token per digit, as in Llama's tokenizer: tiny models learn arithmetic on
            # digits far more easily than on arbitrary merged numbers.
            pre_tokenizers.Digits(individual_digits=True),
            # add_prefix_space=False keeps decode(encode(s)) == s for text that starts a word.
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        # The default clean-up rewrites " ." to "." and so breaks exact round trips.
        clean_up_tokenization_spaces=False,
    )
    logger.info(
        "trained byte-level BPE tokenizer: %d tokens (asked %d)", len(tokenizer), vocab_size
    )
    return tokenizer


def load_tokenizer(spec: str) -> PreTrainedTokenizerBase:
    """Load the shipped tokenizer (``"builtin"``) or a Hugging Face tokenizer directory (a
    path, ``file://``, ``s3://`` or ``hf://`` URI; see :mod:`fedtune.models.hub`).

    Raises:
        ModelError: The directory is missing, holds no tokenizer files, or fails to load.
        StoreError: An ``s3://`` directory cannot be read.
    """
    if spec == BUILTIN:
        root = resources.files("fedtune") / "assets" / "tokenizer"
        # as_file gives a real path even when the package is imported from a zip.
        with resources.as_file(root) as path:
            return _load_dir(Path(path), shown="builtin tokenizer (fedtune/assets/tokenizer)")
    if spec.startswith("s3://"):
        from fedtune.storage import open_store

        return load_tokenizer_from_store(open_store(spec), shown=spec)
    from fedtune.models.hub import local_model_path

    return _load_dir(Path(local_model_path(spec).removeprefix("file://")), shown=spec)


def load_tokenizer_from_store(store: Any, *, shown: str) -> PreTrainedTokenizerBase:
    """The tokenizer directory that ``store`` (a Store, e.g. a tenant's own store confined to
    the tokenizer's prefix) holds, copied to a temporary folder and loaded from there."""
    from fedtune.models.loading import download_store_dir  # loading imports this module

    with tempfile.TemporaryDirectory(prefix="fedtune-tokenizer-") as tmp:
        download_store_dir(store, Path(tmp), shown=shown)
        return _load_dir(Path(tmp), shown=shown)


def _load_dir(path: Path, *, shown: str) -> PreTrainedTokenizerBase:
    if not path.is_dir():
        raise ModelError(
            f"tokenizer directory {shown!r} does not exist",
            fix="Set the tokenizer to 'builtin' or to a directory holding tokenizer.json.",
        )
    found = sorted(p.name for p in path.iterdir())
    known = {"tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model"}
    if not known.intersection(found):
        raise ModelError(
            f"{shown!r} holds no tokenizer files (found: {found or 'nothing'})",
            fix="Point at a directory written by tokenizer.save_pretrained (tokenizer.json).",
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=False
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelError(
            f"cannot load the tokenizer in {shown!r}: {exc}",
            fix="Re-save the tokenizer with transformers >= 5 (save_pretrained).",
        ) from exc
    return tokenizer


def read_info(spec: str) -> dict[str, Any]:
    """The training record written beside a tokenizer by ``scripts/build_tokenizer.py``.

    Raises:
        ModelError: The tokenizer has no such record.
    """
    info: Traversable
    if spec == BUILTIN:
        info = resources.files("fedtune") / "assets" / "tokenizer" / INFO_FILE
        shown = f"builtin tokenizer's {INFO_FILE}"
    else:
        info = Path(spec.removeprefix("file://")) / INFO_FILE
        shown = str(info)
    if not info.is_file():
        raise ModelError(
            f"{shown} does not exist",
            fix="Build the tokenizer with scripts/build_tokenizer.py, which writes it.",
        )
    data: dict[str, Any] = json.loads(info.read_text(encoding="utf-8"))
    return data


def jsonl_texts(paths: Sequence[Path]) -> Iterator[tuple[Path, int, str]]:
    """Yield ``(path, line_number, text)`` for every non-empty text field of every record.

    Raises:
        DataError: A file is missing, or a line is not a JSON object.
    """
    for path in paths:
        for number, record in iter_jsonl(path):
            for field in TEXT_FIELDS:
                value = record.get(field)
                if isinstance(value, str) and value:
                    yield path, number, value


def tokenizer_corpus(paths: Sequence[Path]) -> tuple[list[str], dict[str, int]]:
    """Texts of the JSONL records plus the prompt template, weighted as in training data.

    Each record is shown to the model inside the prompt template, so the template texts are
    repeated once per record to give their merges the frequency they will have.

    Returns:
        The texts, and the number of records read per file (by file name).

    Raises:
        DataError: As :func:`jsonl_texts`, or no file yields any text.
    """
    texts: list[str] = []
    records: dict[str, set[int]] = {}
    for path, number, text in jsonl_texts(paths):
        texts.append(text)
        records.setdefault(str(path), set()).add(number)
    counts = {name: len(lines) for name, lines in records.items()}
    total = sum(counts.values())
    if total == 0:
        raise DataError(
            f"no record in {[str(p) for p in paths]} has a text field {list(TEXT_FIELDS)}",
            fix="Pass instruction-tuning JSONL files (instruction/input/output ...).",
        )
    texts.extend(PROMPT_TEMPLATE_TEXTS * total)
    return texts, counts
