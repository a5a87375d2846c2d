"""FedPT and FedAvg+PT: federated proxy-tuning of a black-box large model (see :mod:`.algorithm`).

Modules: :mod:`.decoding` (Eq. 3 arithmetic and token-by-token decoding, torch only: shipped
inside the registered model), :mod:`.proxy` (the ``LogitSource`` protocol, local models,
``proxy_logits`` and ``generate``), :mod:`.http_source` (an OpenAI-style endpoint as a
``LogitSource``), :mod:`.server` (provider: large model, KD set, Eq. 5 distillation),
:mod:`.algorithm` (the registered classes). The tenant's step is FedAvg's client step on the
small model, inherited unchanged.
"""

from fedtune.algorithms.fedpt.algorithm import FedPT

__all__ = ["FedPT"]
