"""Job description: the one validated, frozen configuration every phase reads from.

The names below load on first use, so that an algorithm package's ``config`` module can
import :mod:`fedtune.config.sections` while the job's union is being built from those modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedtune.config.algorithms import AlgorithmConfig
    from fedtune.config.job import JobConfig, TenantConfig
    from fedtune.config.loading import format_validation_errors, load_job, parse_job

_WHERE = {
    "AlgorithmConfig": "fedtune.config.algorithms",
    "JobConfig": "fedtune.config.job",
    "TenantConfig": "fedtune.config.job",
    "format_validation_errors": "fedtune.config.loading",
    "load_job": "fedtune.config.loading",
    "parse_job": "fedtune.config.loading",
}

__all__ = [
    "AlgorithmConfig",
    "JobConfig",
    "TenantConfig",
    "format_validation_errors",
    "load_job",
    "parse_job",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
