"""FedBiOT and its baselines Offsite-tuning and FedOT (see :mod:`.algorithm`).

Modules: :mod:`.package` (blueprint and tensor groups, config-independent), :mod:`.transport`
(emulator deltas), :mod:`.alignment` (Eq. 2 on public data, torch or DeepSpeed),
:mod:`.client` (tenant), :mod:`.server` (provider), :mod:`.algorithm` (the registered classes).

The section is in :mod:`.config`; this package imports nothing heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedtune.algorithms.fedbiot.algorithm import FedBiOT, FedOT, OffsiteFamily, OffsiteTuning

#: Names re-exported from :mod:`.algorithm`, loaded on first use: the package's import stays
#: light (its ``config`` module is read to build the job's config union).
__all__ = ["FedBiOT", "FedOT", "OffsiteFamily", "OffsiteTuning"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from fedtune.algorithms.fedbiot import algorithm

        return getattr(algorithm, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
