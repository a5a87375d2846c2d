"""The one table at the top of ``docs/benchmarks.md``: every paper claim fedtune tests.

Built from the page itself: each ``quality`` block's JSON is re-evaluated with the one
verdict rule (:func:`fedtune.benchmarks.claims.evaluate_claims`, as the block's own table
does), and each row links to the section (the nearest heading above the block) that holds
the details. A claim tested in several tables gets a row per table: presets differ in
settings, and the reader should see when they disagree.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from fedtune.benchmarks.claims import evaluate_claims
from fedtune.benchmarks.suite import recorded_constant_answers, recorded_public_categories

__all__ = ["QualityBlock", "claims_summary_markdown", "quality_blocks"]

_HEADING: Final = re.compile(r"^(#{1,6}) (.+)$", re.MULTILINE)
_QUALITY_MARKER: Final = re.compile(
    r"^<!-- generated: quality (\S+)(?: commit=\w+)? -->$", re.MULTILINE
)


@dataclass(frozen=True)
class QualityBlock:
    """A quality table on the page: its JSON and the heading of its section."""

    path: str
    heading: str


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return "#" + text.replace(" ", "-")


def quality_blocks(page: str) -> list[QualityBlock]:
    """Every quality block of ``page`` in order, with the heading above it."""
    headings = [(m.start(), m.group(2)) for m in _HEADING.finditer(page)]
    blocks = []
    for marker in _QUALITY_MARKER.finditer(page):
        above = [text for start, text in headings if start < marker.start()]
        blocks.append(QualityBlock(path=marker.group(1), heading=above[-1] if above else ""))
    return blocks


def _paper(source: str) -> str:
    """The papers a claim's source names before its citation or its text
    (``FedPT (paper 002): ...`` -> ``FedPT``; ``FedMKT, FedIT: ...`` -> ``FedMKT, FedIT``)."""
    return re.split(r"\s*[(:]", source, maxsplit=1)[0].strip() or source


def _interval(claim: Mapping[str, Any]) -> str:
    low, high = claim.get("low"), claim.get("high")
    if low is None or high is None:
        return "-"
    return f"[{low:+.3f}, {high:+.3f}]"


def claims_summary_markdown(blocks: Sequence[QualityBlock], root: Path) -> str:
    """One row per claim per quality table: paper, claim, verdict, gain, interval, section."""
    lines = [
        "| paper | claim (metric: better > worse) | verdict | gain | 95% interval | n | details |",
        "|---|---|---|---:|---|---:|---|",
    ]
    counts: dict[str, int] = {}
    for block in blocks:
        results = json.loads((root / block.path).read_text("utf-8"))
        constant_em = recorded_constant_answers(results)
        public = recorded_public_categories(results)
        runs = results.get("runs") or []
        for claim in evaluate_claims(runs, constant_em=constant_em, public_categories=public):
            # "no verdict: premise false (numbers)" counts as one kind, whatever the numbers.
            kind = claim["verdict"].split(" (", 1)[0]
            counts[kind] = counts.get(kind, 0) + 1
            lines.append(
                f"| {_paper(claim['source'])} | {claim['claim']} | **{claim['verdict']}** | "
                f"{claim['difference']:+.3f} | {_interval(claim)} | {claim.get('n', '-')} | "
                f"[{block.heading}]({_anchor(block.heading)}) (`{Path(block.path).name}`) |"
            )
    tally = ", ".join(f"{n} {verdict}" for verdict, n in sorted(counts.items()))
    return "\n".join([f"{len(lines) - 2} claim checks: {tally}.", "", *lines]) + "\n"
