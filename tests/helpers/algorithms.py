"""The algorithm test tables, read from each algorithm package's declared smoke settings.

Every test that runs "each algorithm" takes its rows from here, so a new package brings its
rows and a deleted one takes them away; no test names the algorithms it runs over.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, get_args

from fedtune.algorithms.registry import algorithm_names
from fedtune.config.capabilities import families
from fedtune.config.packages import sections, smoke

DATA = Path(__file__).resolve().parents[2] / "examples" / "data" / "quickstart"

#: Every registered algorithm's quickest ``algorithm:`` section.
SMOKE: dict[str, dict[str, Any]] = {
    name: copy.deepcopy(dict(smoke(name).algorithm)) for name in algorithm_names()
}


def one_per_section(names: list[str]) -> list[str]:
    """Of ``names``, the first each config section accepts: names that share a section share
    the algorithm's class and differ by a setting (FedOpt's optimizer, FedPT's distillation),
    so a costly per-algorithm test runs one row per section."""
    wanted = set(names)
    firsts = (next((n for n in get_args(s.model_fields["name"].annotation) if n in wanted), None)
              for s in sections())
    return [n for n in firsts if n is not None]


def one_per_family() -> list[str]:
    """The first algorithm of every pipeline family (the families' tenant steps differ most)."""
    return [members[0] for members in families().values()]


def tenant_fields(name: str) -> dict[str, Any]:
    """What every tenant entry of an ``name`` job adds (its own model, for instance)."""
    return copy.deepcopy(dict(smoke(name).tenant))


def job_overrides(name: str, data: Path = DATA) -> dict[str, Any]:
    """The job fields, beyond the tiny test job's, that algorithm ``name`` needs to run."""
    declared = smoke(name)
    out: dict[str, Any] = copy.deepcopy(dict(declared.job))
    if declared.public_data:
        out["public_data_uri"] = str(data / "public.jsonl")
    if declared.single_tenant:
        out["tenants"] = [{"name": "all", "data_uri": str(data / "all.jsonl"), **tenant_fields(name)}]
        out["min_clients"] = 1
    elif declared.tenant:
        out["tenants"] = [
            {"name": f"tenant-{x}", "data_uri": str(data / f"tenant-{x}.jsonl"), **tenant_fields(name)}
            for x in "abc"
        ]
    return out
