"""FedMKT's per-model tables: every SLM category cell is the recorded mean, beside the LLM's."""

from __future__ import annotations

import random
from typing import Any

from fedtune.benchmarks.per_model import mean_std, per_model_lines

CATEGORIES = ("arithmetic", "classify", "count", "lookup", "reverse")
TENANTS = ("tenant-1", "tenant-2")


def _stat(rng: random.Random, n: int = 5) -> dict[str, float]:
    return {"mean": rng.random(), "std": rng.random() / 10, "n": n}


def _row(rng: random.Random, method: str, *, llm: bool, slm: bool, slm_categories: bool) -> dict[str, Any]:
    metrics: dict[str, Any] = {}
    if llm:
        metrics["llm/em"] = _stat(rng)
        metrics.update({f"em/{c}": _stat(rng) for c in CATEGORIES})
    if slm:
        metrics.update({"slm/em": _stat(rng), "slm/local_em": _stat(rng)})
        metrics.update({f"slm/em/{t}": _stat(rng) for t in TENANTS})
        if slm_categories:
            metrics.update({f"slm/category_em/{c}": _stat(rng) for c in CATEGORIES})
    return {"method": method, "metrics": metrics}


def _table(rng: random.Random, slm_categories: bool = True) -> list[dict[str, Any]]:
    return [
        _row(rng, "zero-shot", llm=True, slm=True, slm_categories=slm_categories),
        _row(rng, "fedmkt", llm=True, slm=True, slm_categories=slm_categories),
        _row(rng, "centralized", llm=True, slm=False, slm_categories=False),
        _row(rng, "fedavg-small", llm=False, slm=True, slm_categories=slm_categories),
    ]


def _category_rows(lines: list[str]) -> dict[str, list[str]]:
    start = next(i for i, line in enumerate(lines) if line.startswith("Per category"))
    header = lines[start + 2]
    assert header == "| method | " + " | ".join(sorted(CATEGORIES)) + " |"
    rows = {}
    for line in lines[start + 4:]:
        if not line.startswith("| "):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def test_every_slm_category_cell_is_the_recorded_mean_beside_the_llms() -> None:
    for seed in range(20):
        table = _table(random.Random(seed))
        rows = _category_rows(per_model_lines({"table": table}))
        # A row per method with small models; the LLM-only row (centralized) has none.
        assert set(rows) == {"zero-shot", "fedmkt", "fedavg-small"}
        for row in table:
            if row["method"] not in rows:
                continue
            metrics = row["metrics"]
            for category, cell in zip(sorted(CATEGORIES), rows[row["method"]], strict=True):
                expected = f"{metrics[f'slm/category_em/{category}']['mean']:.2f}"
                if "llm/em" in metrics:
                    expected += f" ({metrics[f'em/{category}']['mean']:.2f})"
                assert cell == expected, (row["method"], category)


def test_results_recorded_before_slm_categories_keep_the_per_model_table_only() -> None:
    lines = per_model_lines({"table": _table(random.Random(0), slm_categories=False)})
    assert any(line.startswith("Per model") for line in lines)
    assert not any(line.startswith("Per category") for line in lines)


def test_results_without_small_models_get_no_per_model_tables() -> None:
    rng = random.Random(0)
    table = [_row(rng, m, llm=True, slm=False, slm_categories=False) for m in ("zero-shot", "fedavg")]
    assert per_model_lines({"table": table}) == []


def test_mean_std_gives_the_mean_alone_for_one_run() -> None:
    assert mean_std({"mean": 0.5, "std": 0.0, "n": 1}) == "0.500"
    assert mean_std({"mean": 0.5, "std": 0.0123, "n": 3}) == "0.500 ± 0.012"
    assert mean_std({"mean": 0.5, "std": 0.0123, "n": 3}, digits=2) == "0.50 ± 0.01"
