"""``fedtune``: validate, partition and run federated fine-tuning jobs.

Every command turns a :class:`fedtune.core.errors.FedtuneError` into its message, its fix and
its exit code; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.text import Text

from fedtune import __version__
from fedtune.cli import commands
from fedtune.core.errors import FedtuneError
from fedtune.core.library_logs import quiet_libraries

err = Console(stderr=True, highlight=False)

EPILOG = """\
examples:
  fedtune validate examples/quickstart.yaml
  fedtune run examples/quickstart.yaml --summary-json summary.json
  fedtune run examples/quickstart.yaml --resume        # continue after a crash
  fedtune partition all.jsonl --strategy dirichlet --field category --alpha 0.5 \\
      --out tenant-a=data/a.jsonl --out tenant-b=data/b.jsonl
  fedtune bench engine examples/quickstart.yaml
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="fedtune",
        description="Federated fine-tuning of LLMs: provider and tenants improve a model "
        "together without sharing data or the provider's weights.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fedtune {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in commands.registrars():
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fedtune`` console script."""
    quiet_libraries()
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.handler(args) or 0)
    except FedtuneError as exc:
        # Text objects, not markup: messages quote user values that may contain brackets.
        err.print(Text.assemble(("error: ", "bold red"), str(exc)), soft_wrap=True)
        err.print(Text.assemble(("fix: ", "bold"), exc.fix), soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        err.print("interrupted; finished steps are kept — run again with --resume")
        return 130


def console() -> int:
    """The ``fedtune`` console script (and ``python -m fedtune.cli.main``): :func:`main`,
    with the interpreter's teardown kept short.

    At exit, Python's last garbage collections walk every object the process still holds:
    with torch, transformers and PEFT imported that is about 1.2 s of every command on these
    machines, after the work is done. Freezing them first (:func:`gc.freeze`) leaves that
    walk nothing to do; atexit handlers (logging, MLflow, worker pools) still run, and the
    operating system frees the memory. Only here, never in :func:`main`, which tests and
    other callers run in a process that goes on.
    """
    code = main()
    gc.freeze()
    return code


if __name__ == "__main__":
    sys.exit(console())
