"""FedAvg on LoRA adapters, the FedIT baseline: :mod:`.config` (its section), :mod:`.algorithm`
(the registered class and ``LoraFedAlgorithm``, the base of the FedIT family).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedtune.algorithms.fedavg.algorithm import FedAvg, LoraFedAlgorithm

#: Names re-exported from :mod:`.algorithm`, loaded on first use: the package's import stays
#: light (its ``config`` module is read to build the job's config union).
__all__ = ["FedAvg", "LoraFedAlgorithm"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from fedtune.algorithms.fedavg import algorithm

        return getattr(algorithm, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
