"""Time the MinED vocabulary mapping on a 32k x 50k-sized tokenizer pair, cold and cached.

    OMP_NUM_THREADS=1 python scripts/bench_mined.py [--json docs/results/fedmkt-mined.json]

Trains a SentencePiece-style BPE of 32,000 tokens and a byte-level BPE of 50,000 tokens with
``tokenizers`` on two different generated corpora (pseudo-words from random syllables), then
maps 32k -> 50k twice through a local store: the first run computes, the second reads the
cached table. Writes the times as JSON (with the commit that measured them); the table in
docs/benchmarks.md is generated from it by ``fedtune.benchmarks.report.mined_markdown``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import random
import tempfile
import time
from pathlib import Path

from fedtune.algorithms.fedmkt.vocab import cached_mapping
from fedtune.benchmarks.provenance import provenance
from fedtune.benchmarks.report import mined_markdown
from fedtune.benchmarks.system import device_info
from fedtune.models.tokenizer_families import metaspace_bpe
from fedtune.storage import open_store

SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["th", "st", "ing", "er", "ion"]


def corpus(seed: int, lines: int) -> list[str]:
    rng = random.Random(seed)
    words = ["".join(rng.choices(SYLLABLES, k=rng.randint(1, 4))) for _ in range(60_000)]
    return [" ".join(rng.choices(words, k=20)) for _ in range(lines)]


def main() -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=60_000)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    started = time.perf_counter()
    small = metaspace_bpe(corpus(1, args.lines), 32_000)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus(2, args.lines), trainers.BpeTrainer(
        vocab_size=50_000, special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    large = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    print(f"trained {len(small)} and {len(large)} tokens in {time.perf_counter() - started:.1f} s")
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(tmp)
        t0, c0 = time.perf_counter(), time.process_time()
        table, hit = cached_mapping(store, small, large)
        cold, cold_cpu = time.perf_counter() - t0, time.process_time() - c0
        t0, c0 = time.perf_counter(), time.process_time()
        _, hit2 = cached_mapping(store, small, large)
        warm, warm_cpu = time.perf_counter() - t0, time.process_time() - c0
    assert not hit and hit2 and len(table) == len(small)
    results = {
        "pairs": [{
            "src_vocab": len(small), "dst_vocab": len(large), "cold_s": cold, "cached_s": warm,
            # CPU seconds of this process: what a shared machine's other work does not inflate.
            "cold_cpu_s": cold_cpu, "cached_cpu_s": warm_cpu,
        }],
        "corpus_lines": args.lines,
        "device": device_info(),
        "rapidfuzz": importlib.metadata.version("rapidfuzz"),
        "provenance": provenance("OMP_NUM_THREADS=1 python scripts/bench_mined.py"),
    }
    print(mined_markdown(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
