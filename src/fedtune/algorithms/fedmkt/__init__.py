"""FedMKT: mutual knowledge transfer between the provider's LLM and tenants' own small models
(see :mod:`.algorithm`).

Modules: :mod:`.vocab` (MinED vocabulary tables), :mod:`.align` (DP token alignment, top-k
mapping), :mod:`.knowledge` (knowledge messages), :mod:`.select` (DualMinCE),
:mod:`.transfer` (teachers and the lambda*CE + (1-lambda)*KD training), :mod:`.public` (the
shared public set), :mod:`.server` and :mod:`.client` (each side's selection), :mod:`.algorithm`.

The section is in :mod:`.config`; this package imports nothing heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedtune.algorithms.fedmkt.algorithm import FedMKT

#: Names re-exported from :mod:`.algorithm`, loaded on first use: the package's import stays
#: light (its ``config`` module is read to build the job's config union).
__all__ = ["FedMKT"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from fedtune.algorithms.fedmkt import algorithm

        return getattr(algorithm, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
