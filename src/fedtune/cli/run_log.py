"""``fedtune run``'s output for machines: one line per event, written as it happens.

A terminal gets rich progress bars. Piped to a file, ``kubectl logs`` or a log collector, a
live display shows nothing until the run ends, so there the run writes one line per tenant
step and per round instead, flushed at once: plain text (``--log-format text``) or one JSON
object per line (``--log-format json``), whose log records on stderr are JSON too.
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
import time
from typing import Any, Literal, TextIO

from rich.console import Console

LogFormat = Literal["text", "json"]
#: A console this wide never wraps a line: a table is as wide as its cells.
_UNWRAPPED = 100_000


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _number(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else "-"


def text_line(event: dict[str, Any]) -> str:
    """One line of plain text for an engine event (``tenant_step``, ``round``, ...)."""
    kind = event["event"]
    if kind == "tenant_step":
        where = (
            f"round {event['round']}/{event['rounds']}" if event["kind"] == "client"
            else "final"
        )
        took = f" in {event['seconds']:.1f} s" if event.get("seconds") is not None else ""
        outcome = f"done{took}" if event["ok"] else f"failed: {event.get('failure')}"
        return f"{where}: {event['tenant']} {event['kind']} step {outcome}"
    if kind == "round":
        rejected = "".join(f"; {n} rejected: {why}" for n, why in event["rejected"].items())
        return (
            f"round {event['round']}/{event['rounds']} done: {event['accepted']}/"
            f"{event['sampled']} tenants accepted, train loss {_number(event['train_loss'])}, "
            f"eval loss {_number(event['eval_loss'])}, {event['seconds']:.1f} s{rejected}"
        )
    return " ".join(f"{k}={v}" for k, v in event.items())


class LineLog:
    """Writes each event as one flushed line to ``stream`` (stdout unless given)."""

    def __init__(self, fmt: LogFormat, stream: TextIO | None = None) -> None:
        self.fmt = fmt
        self.stream = stream

    def __call__(self, event: dict[str, Any]) -> None:
        stream = self.stream or sys.stdout
        if self.fmt == "json":
            line = json.dumps({"time": _now(), **event}, sort_keys=True, default=str)
        else:
            line = f"{_now()} {text_line(event)}"
        stream.write(line + "\n")
        stream.flush()


class JsonFormatter(logging.Formatter):
    """A log record as one JSON object (time, level, logger, message)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created)),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def use_json_logs() -> None:
    """Make every handler of the root logger write JSON lines."""
    for handler in logging.getLogger().handlers:
        handler.setFormatter(JsonFormatter())


def summary_console() -> Console:
    """The console the run's summary is printed on: unwrapped where stdout is no terminal
    (rich would hard-wrap at 80 columns, splitting URIs and column headers)."""
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=_UNWRAPPED)
    return console


def continue_command(args: Any) -> str:
    """The exact command that continues a stopped run (``--until-round``, Ctrl-C), with the
    same ``--set`` overrides (a changed job is refused on resume)."""
    words = ["fedtune", "run", args.job, "--resume"]
    for override in getattr(args, "overrides", ()):
        words += ["--set", override]
    for flag, value in (
        ("--engine", args.engine),
        ("--workers", args.workers),
        ("--threads", args.threads),
        ("--summary-json", args.summary_json),
        ("--log-format", args.log_format if args.log_format != "text" else None),
    ):
        if value is not None:
            words += [flag, str(value)]
    if args.no_progress:
        words.append("--no-progress")
    return shlex.join(words)
