"""FedPT and FedAvg+PT: federated proxy-tuning of a black-box large model (see :mod:`.algorithm`).

Modules: :mod:`.decoding` (Eq. 3 arithmetic and token-by-token decoding, torch only: shipped
inside the registered model), :mod:`.proxy` (the ``LogitSource`` protocol, local models,
``proxy_logits`` and ``generate``), :mod:`.http_source` (an OpenAI-style endpoint as a
``LogitSource``), :mod:`.server` (provider: large model, KD set, Eq. 5 distillation),
:mod:`.algorithm` (the registered classes). The tenant's step is FedAvg's client step on the
small model, inherited unchanged.

The section is in :mod:`.config`; this package imports nothing heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedtune.algorithms.fedpt.algorithm import FedPT

#: Names re-exported from :mod:`.algorithm`, loaded on first use: the package's import stays
#: light (its ``config`` module is read to build the job's config union).
__all__ = ["FedPT"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from fedtune.algorithms.fedpt import algorithm

        return getattr(algorithm, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
