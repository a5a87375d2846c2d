"""Copy a pretrained base (``fedtune bench pretrain``'s output) into the package as a shipped base.

    python scripts/ship_base.py .fedtune/bench/models/large quickstart --note "..."

writes ``src/fedtune/assets/bases/NAME/``: the Hugging Face files, ``fedtune_prompt.json``
and the pretraining report with a ``machine`` entry (Python, torch, transformers, platform,
CPU count, and the note: e.g. how many threads trained which steps). Pretraining is
deterministic only on one machine, library set and thread count, so the report says which.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
from pathlib import Path

FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
REPORT = "fedtune_pretrain.json"
ROOT = Path(__file__).resolve().parents[1] / "src" / "fedtune" / "assets" / "bases"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a pretrained model folder with fedtune_pretrain.json")
    parser.add_argument("name", help="the base's name: model.uri builtin://NAME")
    parser.add_argument("--note", default="", help="how it was made, beyond the report")
    args = parser.parse_args(argv)
    missing = [f for f in (*FILES, REPORT) if not (args.source / f).is_file()]
    if missing:
        print(f"error: {args.source} lacks {missing}; pass a `fedtune bench pretrain` model folder",
              file=sys.stderr)
        return 2
    import torch
    import transformers

    from fedtune.models.loading import write_prompt_template

    out = ROOT / args.name
    out.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        shutil.copyfile(args.source / name, out / name)
    report = json.loads((args.source / REPORT).read_text("utf-8"))
    report["machine"] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "note": args.note,
    }
    (out / REPORT).write_text(json.dumps(report, indent=2) + "\n", "utf-8")
    write_prompt_template(out)
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"shipped {args.source} as builtin://{args.name} ({size / 1e6:.1f} MB) in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
