"""Control-variate maths of SCAFFOLD (Karimireddy et al. 2020, "SCAFFOLD: Stochastic
Controlled Averaging for Federated Learning", Algorithm 1, option II).

With global parameters ``x``, server control variate ``c``, client control variate ``c_i``,
``K`` local steps at learning rate ``eta_l`` and ``N`` clients in total of which the set ``S``
took part in the round:

    client step:   y_i <- y_i - eta_l * (g_i(y_i) - c_i + c)                  (Alg. 1 line 10)
    new variate:   c_i+ = c_i - c + (x - y_i) / (K * eta_l)                   (option II)
    server:        x <- x + eta_g * mean_{i in S}(y_i - x)                    (line 17)
                   c <- c + (|S| / N) * mean_{i in S}(c_i+ - c_i)             (line 17)

The server's ``c`` update is ``(1/N) * sum_{i in S}``: the ``|S|/N`` factor matters whenever not
every client takes part (NVIDIA FLARE's implementation omits it). The paper averages client
models without sample weights, and so do we. ``c_i`` is client state: it stays with the
tenant, only ``c_i+ - c_i`` is sent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fedtune.aggregation.state_ops import TensorDict, check_same_layout
from fedtune.core.errors import ConfigError, QuorumError, UpdateRejected

_F64 = torch.float64


def scaffold_client_correction(grad: TensorDict, c_i: TensorDict, c: TensorDict) -> TensorDict:
    """Corrected local gradient ``g - c_i + c`` (Algorithm 1, line 10).

    Args:
        grad: The gradient of the local loss, per trainable parameter.
        c_i: The client's control variate.
        c: The server's control variate.

    Returns:
        The corrected gradient, in ``grad``'s dtypes.
    """
    check_same_layout([grad, c_i, c], names=("grad", "c_i", "c"), check_dtype=False)
    return {k: g - c_i[k].to(g.dtype) + c[k].to(g.dtype) for k, g in grad.items()}


def scaffold_new_client_variate(
    c_i: TensorDict,
    c: TensorDict,
    x: TensorDict,
    y_i: TensorDict,
    local_steps: int,
    lr: float,
) -> TensorDict:
    """Option II control variate ``c_i+ = c_i - c + (x - y_i) / (K * lr)`` (Algorithm 1, line 12).

    Args:
        c_i: The client's control variate before the round.
        c: The server's control variate broadcast this round.
        x: The global parameters broadcast this round.
        y_i: The client's parameters after ``local_steps`` steps.
        local_steps: ``K``, the number of local optimizer steps actually taken.
        lr: ``eta_l``, the local learning rate.

    Returns:
        ``c_i+`` in ``c_i``'s dtypes.

    Raises:
        ConfigError: ``local_steps < 1`` or ``lr <= 0``.
    """
    if local_steps < 1:
        raise ConfigError(
            f"SCAFFOLD needs at least one local step to update c_i, got local_steps={local_steps}",
            fix="Give each tenant data for at least one optimizer step per round.",
        )
    if not (math.isfinite(lr) and lr > 0):
        raise ConfigError(
            f"SCAFFOLD's option II divides by the local learning rate, got lr={lr!r}",
            fix="Use a positive local learning rate.",
        )
    check_same_layout([c_i, c, x, y_i], names=("c_i", "c", "x", "y_i"), check_dtype=False)
    denom = float(local_steps) * lr
    return {
        k: (ci.to(_F64) - c[k].to(_F64) + (x[k].to(_F64) - y_i[k].to(_F64)) / denom).to(ci.dtype)
        for k, ci in c_i.items()
    }


def scaffold_server_update(
    x: TensorDict,
    c: TensorDict,
    y_list: Sequence[TensorDict],
    dc_list: Sequence[TensorDict],
    n_total_clients: int,
    global_lr: float,
    weights: Sequence[float] | None = None,
) -> tuple[TensorDict, TensorDict]:
    """Server step of SCAFFOLD (Algorithm 1, line 17), with the ``|S|/N`` factor.

    Args:
        x: Global parameters of this round.
        c: Server control variate of this round.
        y_list: The participating clients' parameters ``y_i`` (``|S|`` of them).
        dc_list: Their control-variate deltas ``c_i+ - c_i``, in the same order.
        n_total_clients: ``N``, every client of the federation, participating or not.
        global_lr: ``eta_g``; 1.0 makes the model update plain (unweighted) averaging.
        weights: Client weights of the model mean (normalised here), e.g. sample counts;
            None: uniform, as in the paper. The control variate's mean is always uniform.

    Returns:
        ``(x_new, c_new)`` in the dtypes of ``x`` and ``c``.

    Raises:
        QuorumError: No client updates.
        UpdateRejected: The lists differ in length, or keys/shapes differ.
        ConfigError: ``N < |S|`` or a non-positive ``global_lr``.
    """
    n_s = len(y_list)
    if n_s == 0:
        raise QuorumError(
            "no SCAFFOLD updates to aggregate (got 0)",
            fix="At least one tenant must deliver a valid update before aggregation.",
        )
    if len(dc_list) != n_s:
        raise UpdateRejected(
            f"got {n_s} client models but {len(dc_list)} control-variate deltas",
            fix="Every SCAFFOLD update must carry both y_i and c_i+ - c_i.",
        )
    if n_total_clients < n_s:
        raise ConfigError(
            f"n_total_clients={n_total_clients} is smaller than the {n_s} participating clients",
            fix="Pass the number of all tenants of the job as n_total_clients.",
        )
    if not (math.isfinite(global_lr) and global_lr > 0):
        raise ConfigError(
            f"global_lr={global_lr!r} must be a finite number > 0",
            fix="Use a positive server learning rate (1.0 for plain averaging).",
        )
    check_same_layout(
        [x, c, *y_list],
        names=["x", "c", *(f"y_list[{i}]" for i in range(n_s))],
        check_dtype=False,
    )
    check_same_layout(
        [c, *dc_list], names=["c", *(f"dc_list[{i}]" for i in range(n_s))], check_dtype=False
    )
    if weights is not None and (len(weights) != n_s or not all(w > 0 for w in weights)):
        raise UpdateRejected(
            f"got {n_s} client models but weights {list(weights)}",
            fix="Pass one positive weight per client model.",
        )
    shares = [w / sum(weights) for w in weights] if weights is not None else [1.0 / n_s] * n_s
    mean_dy = {
        k: sum(
            (s * (y[k].to(_F64) - x_t.to(_F64)) for s, y in zip(shares, y_list, strict=True)),
            torch.zeros_like(x_t, dtype=_F64),
        )
        for k, x_t in x.items()
    }
    mean_dc = {
        k: sum((dc[k].to(_F64) for dc in dc_list), torch.zeros_like(c_t, dtype=_F64)) / n_s
        for k, c_t in c.items()
    }
    return scaffold_server_step(x, c, mean_dy, mean_dc, n_s, n_total_clients, global_lr)


def scaffold_server_step(
    x: TensorDict,
    c: TensorDict,
    mean_dy: TensorDict,
    mean_dc: TensorDict,
    n_participants: int,
    n_total_clients: int,
    global_lr: float,
) -> tuple[TensorDict, TensorDict]:
    """Line 17 from the means alone: ``x + eta_g * mean_dy``, ``c + (|S|/N) * mean_dc``.

    What secure aggregation can run: it learns only the sums of ``y_i - x`` and of
    ``c_i+ - c_i`` over ``S`` (and ``|S|``), never a single client's.
    """
    frac = n_participants / n_total_clients
    x_new = {k: (x_t.to(_F64) + global_lr * mean_dy[k].to(_F64)).to(x_t.dtype) for k, x_t in x.items()}
    c_new = {k: (c_t.to(_F64) + frac * mean_dc[k].to(_F64)).to(c_t.dtype) for k, c_t in c.items()}
    return x_new, c_new
