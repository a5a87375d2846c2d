"""FewFedPIT's synthetic data per client step: how many instructions the global
model generated, how many each filter dropped, how many examples passed, were kept by IFS
and trained on (paper 004, Section 3.3; :mod:`fedtune.algorithms.fewfedpit.synthesis`).

A quality run records one entry per FewFedPIT client step (``synthesis_steps`` in its run
record, from the tenants' counts in the job summary: counts only, no text); the Markdown
table sums them up per method, with the share of steps that trained on at least one
synthetic example (the premise of FewFedPIT's claims).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

__all__ = ["COUNTS", "synthesis_lines", "synthesis_steps"]

# Entry field -> the tenant metric it comes from (fewfedpit/<name>).
_SOURCES: Final[dict[str, str]] = {
    "generated": "instruction_prompts",
    "rejected_format": "rejected_format",
    "rejected_similar_instruction": "rejected_similar_instruction",
    "rejected_unparsed": "rejected_unparsed",
    "rejected_similar_example": "rejected_similar_example",
    "passed": "candidates",
    "kept": "kept",
}
#: The counts of an entry, in the order of the pipeline.
COUNTS: Final[tuple[str, ...]] = (*_SOURCES, "used")
_HEADERS: Final = (
    "generated", "format ✗", "similar instr. ✗", "unparsed ✗", "similar example ✗",
    "passed", "kept (IFS)", "used",
)


def synthesis_steps(rounds: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per client step that ran FewFedPIT's synthesis, in round and tenant order:
    ``round``, ``tenant`` and :data:`COUNTS` (``used``: the kept examples, when W^g trained on
    them)."""
    entries = []
    for record in rounds:
        for tenant, step in sorted(record["tenants"].items()):
            metrics = step.get("metrics") or {}
            if "fewfedpit/instruction_prompts" not in metrics:
                continue
            entry: dict[str, Any] = {"round": int(record["round"]), "tenant": tenant}
            entry |= {k: int(metrics.get(f"fewfedpit/{m}", 0)) for k, m in _SOURCES.items()}
            entry["used"] = entry["kept"] if metrics.get("fewfedpit/synthetic_steps", 0) > 0 else 0
            entries.append(entry)
    return entries


def synthesis_lines(results: Mapping[str, Any]) -> list[str]:
    """The per-method table of synthetic data per client step (means over every client step
    of every seed), or nothing when no run recorded any."""
    methods: dict[str, list[dict[str, Any]]] = {}
    for run in results["runs"]:
        if run.get("synthesis_steps"):
            methods.setdefault(run["method"], []).extend(run["synthesis_steps"])
    if not methods:
        return []
    lines = [
        "",
        "Synthetic data per client step (FewFedPIT; mean per step over every seed's steps; "
        "✗: dropped by that filter):",
        "",
        "| method | client steps | " + " | ".join(_HEADERS) + " | steps using ≥ 1 |",
        "|---|---:|" + "---:|" * len(_HEADERS) + "---:|",
    ]
    for method, steps in methods.items():
        means = [sum(s[k] for s in steps) / len(steps) for k in COUNTS]
        using = sum(s["used"] > 0 for s in steps)
        lines.append(
            f"| {method} | {len(steps)} | "
            + " | ".join(f"{m:.1f}" for m in means)
            + f" | {using} ({using / len(steps):.0%}) |"
        )
    return lines
