"""Train the byte-level BPE tokenizer that fedtune ships, from instruction-tuning JSONL files.

Usage:
    python scripts/build_tokenizer.py --input examples/data/quickstart/*.jsonl \\
        --vocab-size 1024 --out src/fedtune/assets/tokenizer

The tokenizer learns from the text fields of every record plus the fixed prompt-template text,
and a ``fedtune_tokenizer.json`` beside it records the requested vocabulary size and the
sha256 of every input file, so anyone can rebuild and compare.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
from pathlib import Path

import tokenizers
import transformers

from fedtune.core.errors import FedtuneError
from fedtune.models.tokenizer import INFO_FILE, tokenizer_corpus, train_tokenizer

logger = logging.getLogger("build_tokenizer")


def build(inputs: list[Path], vocab_size: int, out: Path) -> dict[str, object]:
    """Train on ``inputs``, save the tokenizer and its info file to ``out``; return the info."""
    texts, counts = tokenizer_corpus(inputs)
    tokenizer = train_tokenizer(texts, vocab_size=vocab_size)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out))
    info: dict[str, object] = {
        "vocab_size": vocab_size,
        "actual_vocab_size": len(tokenizer),
        "special_tokens": {"<pad>": 0, "<s>": 1, "</s>": 2},
        # File names only: absolute paths of the builder's machine mean nothing to users.
        "trained_on": [
            {
                "file": path.name,
                "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                "records": counts.get(str(path), 0),
            }
            for path in inputs
        ],
        "includes_prompt_template": True,
        "tokenizers_version": tokenizers.__version__,
        "transformers_version": transformers.__version__,
    }
    (out / INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n", "utf-8")
    logger.info("wrote %d-token tokenizer to %s", len(tokenizer), out)
    return info


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", nargs="+", required=True, type=Path, help="JSONL files")
    parser.add_argument("--vocab-size", type=int, default=1024, help="upper bound of the vocab")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        build(sorted(args.input), args.vocab_size, args.out)
    except FedtuneError as exc:
        logger.error("%s", exc.render())
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
