"""Pure aggregation maths: weighted means, FedOPT server optimizers, SCAFFOLD, update checks.

No I/O and no global state: every function takes state dicts (``dict[str, Tensor]``) and
returns new ones, so algorithms can call them from any phase and tests can check them by hand.
"""

from fedtune.aggregation.fedopt import (
    ServerOptConfig,
    ServerOptKind,
    server_opt_init,
    server_opt_step,
)
from fedtune.aggregation.scaffold import (
    scaffold_client_correction,
    scaffold_new_client_variate,
    scaffold_server_step,
    scaffold_server_update,
)
from fedtune.aggregation.state_ops import (
    TensorDict,
    add,
    check_same_layout,
    deltas,
    scale,
    sub,
    weighted_mean,
    zeros_like,
)
from fedtune.aggregation.validation import TensorSpec, update_nbytes, validate_update
from fedtune.aggregation.weights import WeightMode, client_weights

__all__ = [
    "TensorSpec",
    "WeightMode",
    "client_weights",
    "ServerOptConfig",
    "ServerOptKind",
    "TensorDict",
    "add",
    "check_same_layout",
    "deltas",
    "scaffold_client_correction",
    "scaffold_new_client_variate",
    "scaffold_server_step",
    "scaffold_server_update",
    "scale",
    "server_opt_init",
    "server_opt_step",
    "sub",
    "update_nbytes",
    "validate_update",
    "weighted_mean",
    "zeros_like",
]
