"""FedMKT's per-model tables: the LLM and each tenant's small model (SLM), scored apart.

A FedMKT run ends with models on both sides of the boundary (paper 003, Section 3): the
provider's LLM and one SLM per tenant. The quality table scores the LLM; these tables add
each tenant's SLM (``slm/em/<tenant>``), their mean, and the SLMs' mean EM per test category
(``slm/category_em/<category>``), which shows whether what the LLM knows and the SLMs do not
(the premise, :mod:`fedtune.benchmarks.premises`) reaches them through the knowledge.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["mean_std", "per_model_lines"]

_SLM_CATEGORY: Final = "slm/category_em/"


def mean_std(stats: Mapping[str, float], digits: int = 3) -> str:
    """``mean ± std`` over seeds, the mean alone for a single run."""
    if stats["n"] < 2:
        return f"{stats['mean']:.{digits}f}"
    return f"{stats['mean']:.{digits}f} ± {stats['std']:.{digits}f}"


def per_model_lines(results: Mapping[str, Any]) -> list[str]:
    """The per-model tables ("-": the method has no such model), or none when the results
    score no SLM."""
    table = results["table"]
    if not any("slm/em" in row["metrics"] for row in table):
        return []
    return _model_lines(table) + _slm_category_lines(table) + _tenant_model_lines(results)


def _model_lines(table: list[Mapping[str, Any]]) -> list[str]:
    tenants = sorted(
        {k.split("/", 2)[2] for row in table for k in row["metrics"] if k.startswith("slm/em/")}
    )
    keys = ["llm/em", "slm/em", "slm/local_em", *(f"slm/em/{t}" for t in tenants)]
    lines = [
        "",
        "Per model: the LLM (the benchmark's model) and the tenants' small models, each scored "
        "on the test set; SLM = mean over tenants, SLM local = each on its own tenant's task mix.",
        "",
        "| method | LLM EM | SLM EM | SLM local EM | " + " | ".join(f"SLM EM {t}" for t in tenants) + " |",
        "|---|" + "---:|" * len(keys),
    ]
    for row in table:
        metrics = row["metrics"]
        cells = [mean_std(metrics[k]) if k in metrics else "-" for k in keys]
        lines.append(f"| {row['method']} | " + " | ".join(cells) + " |")
    return lines


def _slm_category_lines(table: list[Mapping[str, Any]]) -> list[str]:
    """The SLMs' mean EM per category, beside the LLM's, for the rows that record it (results
    from before ``slm/category_em`` was recorded get no table)."""
    categories = sorted(
        {k.removeprefix(_SLM_CATEGORY) for row in table for k in row["metrics"]
         if k.startswith(_SLM_CATEGORY)}
    )
    if not categories:
        return []
    lines = [
        "",
        "Per category: the SLMs' mean EM (over tenants, then seeds) and, in brackets, the "
        "LLM's, on the same test records.",
        "",
        "| method | " + " | ".join(categories) + " |",
        "|---|" + "---:|" * len(categories),
    ]
    for row in table:
        metrics = row["metrics"]
        if not any(k.startswith(_SLM_CATEGORY) for k in metrics):
            continue
        cells = []
        for category in categories:
            slm = metrics.get(_SLM_CATEGORY + category)
            llm = metrics.get(f"em/{category}") if "llm/em" in metrics else None
            cell = "-" if slm is None else f"{slm['mean']:.2f}"
            cells.append(cell if llm is None else f"{cell} ({llm['mean']:.2f})")
        lines.append(f"| {row['method']} | " + " | ".join(cells) + " |")
    return lines


def _tenant_model_lines(results: Mapping[str, Any]) -> list[str]:
    """Which small model each tenant has, when tenants' models differ (``tenant_models``)."""
    models = results.get("tenant_models")
    if not models:
        return []
    lines = [
        "",
        "Each tenant's own small model (pretrained from scratch on the suite's pretraining "
        "corpus with its own tokenizer):",
        "",
        "| tenant | model | architecture | layers x width | tokenizer | vocabulary | parameters |",
        "|---|---|---|---:|---|---:|---:|",
    ]
    for tenant, m in sorted(models.items()):
        lines.append(
            f"| {tenant} | {m['model']} | {m['arch']} | {m['layers']} x {m['hidden']} | "
            f"{m['tokenizer']} | {m['vocab_size']:,} | {m['parameters']:,} |"
        )
    return lines
