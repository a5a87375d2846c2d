"""Tuned methods: pick a grid point on the validation split, report it on the test split.

A tuned method (``fedadam`` tuned over its server learning rate) is a grid of method labels
(``fedadam@eta=0.001``, ``fedadam@eta=0.01`` ...) that all ran with the same seeds. The point
with the highest mean final ``val/em`` over the seeds wins (ties: the lower mean ``val/loss``,
then the first listed), as Reddi et al. 2021 pick each optimizer's best server learning rate
per task; its runs are then reported under the tuned method's name, scored on the test set,
which the choice never saw. The grid itself is kept in the results (every point's validation
and test scores), so the table shows what was searched and what was picked.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["select_tuned"]


def _point(runs: Sequence[Mapping[str, Any]], label: str) -> dict[str, Any]:
    finals = [run["rounds"][-1] for run in runs if run["method"] == label]
    return {
        "label": label,
        "n": len(finals),
        "val_em": statistics.fmean(f["val/em"] for f in finals),
        "val_loss": statistics.fmean(f["val/loss"] for f in finals),
        "test_em": statistics.fmean(f["em"] for f in finals),
    }


def select_tuned(
    runs: Sequence[Mapping[str, Any]], grids: Mapping[str, Sequence[str]]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The runs of each tuned method's chosen point, relabelled with the tuned method's name
    (``kind`` "tuned", ``selected`` the label), and per tuned method its grid and choice."""
    chosen_runs: list[dict[str, Any]] = []
    selection: dict[str, Any] = {}
    for name, grid in grids.items():
        points = [_point(runs, label) for label in grid]
        best = min(
            range(len(points)),
            key=lambda i: (-points[i]["val_em"], points[i]["val_loss"], i),
        )
        selection[name] = {"grid": points, "selected": points[best]["label"]}
        chosen_runs += [
            {**run, "method": name, "kind": "tuned", "selected": points[best]["label"]}
            for run in runs
            if run["method"] == points[best]["label"]
        ]
    return chosen_runs, selection
