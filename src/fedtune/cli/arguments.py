"""Argument types that refuse bad values while parsing (argparse exits 2 with the message)."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """A whole number >= 1 (``--until-round``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; use 1 or more") from None
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"{value} is not a round; use 1 or more (rounds count from 1)"
        )
    return value


def k_values(text: str) -> tuple[int, ...]:
    """Comma-separated positive integers, sorted and without repeats (``--k 1,10``)."""
    values = set()
    for part in text.split(","):
        try:
            value = int(part.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{part.strip()!r} in {text!r} is not a whole number; write k values like 1,10"
            ) from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"k={value} in {text!r}: pass@k needs k >= 1")
        values.add(value)
    return tuple(sorted(values))


def add_set_option(p: argparse.ArgumentParser) -> None:
    """``--set FIELD.PATH=VALUE`` (repeatable): override job fields without editing the file."""
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD.PATH=VALUE",
        dest="overrides",
        help="override one job field, read as YAML (repeatable): --set training.lr=0.01 "
        "--set tenants.tenant-a.data_uri=data/a.jsonl (a tenant by position or name; paths "
        "relative to the working directory)",
    )
