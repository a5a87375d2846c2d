"""``fedtune audit memorization``: how much of its training data a model reproduces.

Prints numbers and line numbers only, never a record's text or a generation: the output may
be pasted into tickets and CI logs.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

out = Console(highlight=False)

DEFAULT_RECORDS = 100  # FewFedPIT audits 100 training examples
DEFAULT_MAX_NEW_TOKENS = 64

EPILOG = """\
examples:
  fedtune audit memorization .fedtune/artifacts/quickstart/model --data data/tenant-a.jsonl
  fedtune audit memorization models:/quickstart@candidate --data s3://bucket-a/train.jsonl \\
      --records 100 --threshold 0.7 --json audit.json
"""


def _check_options(args: argparse.Namespace) -> None:
    from fedtune.core.errors import ConfigError
    from fedtune.serving.local_server import check_max_new_tokens

    if args.records < 1:
        raise ConfigError(
            f"--records is {args.records}; at least one record must be audited",
            fix=f"Pass --records N with N >= 1 (FewFedPIT audits {DEFAULT_RECORDS}).",
        )
    if not (math.isfinite(args.threshold) and 0.0 <= args.threshold <= 1.0):
        raise ConfigError(
            f"--threshold is {args.threshold}; it is a Rouge-L value between 0 and 1",
            fix="Pass e.g. --threshold 0.7 (FewFedPIT's near-copy cut-off).",
        )
    check_max_new_tokens(args.max_new_tokens, "--max-new-tokens")


def _load(model_uri: str, tracking_uri: str | None, tmp: Path) -> tuple[Any, Any]:
    """The model ``model_uri`` names: a registered version, or an exported directory."""
    from fedtune.models.loading import load_exported

    if model_uri.startswith("models:/"):
        from fedtune.serving.mlflow_registry import ModelRegistry
        from fedtune.serving.refs import parse_model_spec

        spec = parse_model_spec(model_uri)
        hf_dir = ModelRegistry.connect(tracking_uri).download_hf_dir(spec, tmp)
        return load_exported(str(hf_dir), named="MODEL")
    return load_exported(model_uri, named="MODEL")


def _memorization(args: argparse.Namespace) -> int:
    _check_options(args)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from fedtune.data.loader import read_numbered_examples
    from fedtune.eval.audit import audit_model

    fmt = None if args.format == "auto" else args.format
    records = read_numbered_examples(args.data, fmt, named="--data")  # before the model: fail fast on bad data
    with tempfile.TemporaryDirectory(prefix="fedtune-audit-") as tmp:
        model, tokenizer = _load(args.model, args.tracking_uri, Path(tmp))
        with Progress(
            TextColumn("[bold]audit"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(), console=Console(stderr=True), transient=True,
        ) as bar:
            task = bar.add_task("audit", total=min(args.records, len(records)))
            outcome = audit_model(
                model, tokenizer, records,
                max_records=args.records, seed=args.seed, threshold=args.threshold,
                max_new_tokens=args.max_new_tokens, on_record=lambda: bar.advance(task),
            )
    scores = outcome.scores
    out.print(Text(f"memorization audit of {args.model}: {scores.n} of {len(records)} records "
                   f"of {args.data} (seed {args.seed})"), soft_wrap=True)
    out.print(f"mean Rouge-L {scores.mean:.4f}  p50 {scores.p50:.4f}  p90 {scores.p90:.4f}  "
              f"max {scores.max:.4f}")
    out.print(f"at or above {scores.threshold:.2f}: {scores.num_at_or_above} of {scores.n}")
    top = ", ".join(f"{line} ({score:.3f})" for line, score in outcome.top_leaked())
    out.print(f"most reproduced records, by line: {top}")
    if args.json:
        report = {
            "model": args.model,
            "data": args.data,
            "seed": args.seed,
            "scores": scores.to_json(),
            "top_leaked": [{"line": line, "rouge_l": s} for line, s in outcome.top_leaked()],
            "records": [
                {"line": line, "rouge_l": s}
                for line, s in zip(outcome.lines, outcome.report.scores, strict=True)
            ],
        }
        Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 0


def register_audit(sub: Any) -> None:
    """Add ``fedtune audit`` to the CLI."""
    p = sub.add_parser("audit", help="audit a model for leakage of its training data")
    kinds = p.add_subparsers(dest="audit", required=True, metavar="AUDIT")
    mem = kinds.add_parser(
        "memorization",
        help="Rouge-L of greedy generations against training responses (FewFedPIT Sec. 5.4)",
        description="Prompt MODEL with the training template of each sampled record of --data, "
        "decode greedily and score Rouge-L against the record's true response. Prints the mean, "
        "p50, p90 and max, how many records reach --threshold, and the line numbers of the most "
        "reproduced records (never their text). Record the mean on a registered version as the "
        "tag fedtune.audit.memorization to gate `fedtune promote --max-leakage`.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mem.add_argument(
        "model",
        help="an exported model directory (path, file:// or s3://; base weights plus adapter/) "
        "or a registered version, models:/NAME@ALIAS or models:/NAME/VERSION",
    )
    mem.add_argument("--data", required=True, metavar="URI",
                     help="training data (JSONL; path, file:// or s3://)")
    mem.add_argument("--format", choices=("auto", "alpaca", "dolly", "gsm8k", "chat"), default="auto",
                     help="record format of --data (default: detected)")
    mem.add_argument("--records", type=int, default=DEFAULT_RECORDS, metavar="N",
                     help=f"records audited, a seeded sample (default {DEFAULT_RECORDS})")
    mem.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    mem.add_argument("--threshold", type=float, default=0.7, metavar="T",
                     help="Rouge-L at or above which a record counts as reproduced (default 0.7)")
    mem.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, metavar="K",
                     help=f"tokens generated per record (default {DEFAULT_MAX_NEW_TOKENS})")
    mem.add_argument("--json", metavar="PATH",
                     help="also write scores and per-record Rouge-L by line number as JSON")
    mem.add_argument("--tracking-uri",
                     help="MLflow URI for models:/ (default: MLFLOW_TRACKING_URI, else "
                     "sqlite:///.fedtune/mlflow.db)")
    mem.set_defaults(handler=_memorization)
