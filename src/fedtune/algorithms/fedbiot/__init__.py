"""FedBiOT and its baselines Offsite-tuning and FedOT (see :mod:`.algorithm`).

Modules: :mod:`.package` (blueprint and tensor groups, config-independent), :mod:`.transport`
(emulator deltas), :mod:`.alignment` (Eq. 2 on public data, torch or DeepSpeed),
:mod:`.client` (tenant), :mod:`.server` (provider), :mod:`.algorithm` (the registered classes).
"""

from fedtune.algorithms.fedbiot.algorithm import (
    FedBiOT,
    FedOT,
    OffsiteFamily,
    OffsiteTuning,
)

__all__ = ["FedBiOT", "FedOT", "OffsiteFamily", "OffsiteTuning"]
