"""FedMKT: mutual knowledge transfer between the provider's LLM and tenants' own small models
(see :mod:`.algorithm`).

Modules: :mod:`.vocab` (MinED vocabulary tables), :mod:`.align` (DP token alignment, top-k
mapping), :mod:`.knowledge` (knowledge messages), :mod:`.select` (DualMinCE),
:mod:`.transfer` (teachers and the lambda*CE + (1-lambda)*KD training), :mod:`.public` (the
shared public set), :mod:`.server` and :mod:`.client` (each side's selection), :mod:`.algorithm`.
"""

from fedtune.algorithms.fedmkt.algorithm import FedMKT

__all__ = ["FedMKT"]
