"""Built-in algorithms, one module (or package) each.

Importing this package imports none of them: :func:`fedtune.algorithms.registry.get_algorithm`
imports the one a job names, so a process pays only for the algorithm it runs.
``Algorithm`` and ``Artifact`` are re-exported from :mod:`fedtune.algorithms.base` on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedtune.algorithms.base import Algorithm, Artifact

__all__ = ["Algorithm", "Artifact"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from fedtune.algorithms import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
