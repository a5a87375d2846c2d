"""Train the two tenant tokenizers of examples/fedmkt.yaml (offline, deterministic).

    python scripts/build_fedmkt_tokenizers.py

writes ``examples/tokenizers/fedmkt-sentencepiece`` (Llama-style "▁" BPE) and
``examples/tokenizers/fedmkt-wordpiece`` (BERT-style uncased WordPiece), 512 tokens each,
trained on the quickstart data and the prompt template. The provider's LLM keeps the builtin
byte-level BPE, so the example has three tokenizers of three families.
"""

from __future__ import annotations

from pathlib import Path

from fedtune.models.tokenizer import tokenizer_corpus
from fedtune.models.tokenizer_families import metaspace_bpe, wordpiece

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 512


def main() -> None:
    texts, _ = tokenizer_corpus(sorted((ROOT / "examples" / "data" / "quickstart").glob("*.jsonl")))
    out = ROOT / "examples" / "tokenizers"
    metaspace_bpe(texts, VOCAB).save_pretrained(out / "fedmkt-sentencepiece")
    wordpiece(texts, VOCAB).save_pretrained(out / "fedmkt-wordpiece")
    print(f"wrote {out}/fedmkt-sentencepiece and {out}/fedmkt-wordpiece")


if __name__ == "__main__":
    main()
