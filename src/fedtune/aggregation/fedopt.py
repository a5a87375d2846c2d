"""Server optimizers of FedOPT (Reddi et al. 2021, "Adaptive Federated Optimization").

Implements Algorithm 2 of the paper (FedAdagrad, FedYogi, FedAdam) and the server SGD with
momentum it generalises (FedAvgM; FedAvg when ``eta = 1`` and ``beta1 = 0``). With
``delta_t`` the mean of the client updates ``y_i - x_t`` (uniform in Algorithm 2; the
algorithm's ``aggregation_weights`` picks the weights):

    m_t = beta1 * m_{t-1} + (1 - beta1) * delta_t
    adagrad: v_t = v_{t-1} + delta_t^2
    adam:    v_t = beta2 * v_{t-1} + (1 - beta2) * delta_t^2
    yogi:    v_t = v_{t-1} - (1 - beta2) * delta_t^2 * sign(v_{t-1} - delta_t^2)
    x_{t+1} = x_t + eta * m_t / (sqrt(v_t) + tau)          (adaptive kinds)
    x_{t+1} = x_t + eta * m_t                               (sgd)

As in the paper there is no bias correction. Known deviations in reference implementations
that we do not repeat: squaring the momentum instead of ``delta`` in ``v``, and Adam-style bias correction (with an off-by-one exponent).

Initial state: ``m_{-1} = 0``. Algorithm 2 initialises ``v_{-1} >= tau^2`` (the condition its
convergence analysis needs); :class:`ServerOptConfig` makes that value explicit as
``v_init`` and defaults it to ``tau^2``, the smallest value the paper admits. ``v_init = 0``
reproduces implementations that start from zeros (Flower, FedML).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch

from fedtune.aggregation.state_ops import TensorDict, check_same_layout
from fedtune.core.errors import ConfigError

ServerOptKind = Literal["sgd", "adagrad", "adam", "yogi"]
_KINDS: tuple[str, ...] = ("sgd", "adagrad", "adam", "yogi")


@dataclass(frozen=True)
class ServerOptConfig:
    """Hyperparameters of one FedOPT server optimizer (Reddi et al. 2021, Algorithm 2).

    Attributes:
        kind: ``sgd`` (server momentum SGD), ``adagrad``, ``adam`` or ``yogi``.
        eta: Server learning rate (``eta`` in the paper). No default: its scale must match
            the scale of the client updates (LoRA deltas are often 1e-4..1e-2).
        beta1: Momentum decay; the paper's experiments use 0.9. ``0`` disables momentum.
        beta2: Second-moment decay for adam/yogi; the paper's experiments use 0.99.
        tau: Adaptivity (``tau`` in the paper): added to ``sqrt(v)``; the paper's default
            grid value is 1e-3. Must be > 0 for the adaptive kinds.
        v_init: ``v_{-1}``. ``None`` means ``tau**2`` (Algorithm 2 requires
            ``v_{-1} >= tau^2``); after construction it always holds a float.
    """

    kind: ServerOptKind
    eta: float
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3
    v_init: float | None = field(default=None)

    def __post_init__(self) -> None:
        problems: list[str] = []
        if self.kind not in _KINDS:
            problems.append(f"kind={self.kind!r} is not one of {list(_KINDS)}")
        if not (math.isfinite(self.eta) and self.eta > 0):
            problems.append(f"eta={self.eta!r} must be a finite number > 0")
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not (0.0 <= value < 1.0):
                problems.append(f"{name}={value!r} must be in [0, 1)")
        if self.kind != "sgd" and not (math.isfinite(self.tau) and self.tau > 0):
            problems.append(f"tau={self.tau!r} must be > 0 for kind={self.kind!r}")
        if self.v_init is None:
            # A frozen dataclass resolves its derived default here, once.
            object.__setattr__(self, "v_init", float(self.tau) ** 2)
        elif not (math.isfinite(self.v_init) and self.v_init >= 0):
            problems.append(f"v_init={self.v_init!r} must be a finite number >= 0")
        if problems:
            raise ConfigError(
                "invalid server optimizer settings: " + "; ".join(problems),
                fix="Use eta > 0, 0 <= beta1, beta2 < 1, tau > 0 and v_init >= 0 "
                "(v_init defaults to tau**2 as in Reddi et al. 2021, Algorithm 2).",
            )


def _state_dtype(x: torch.Tensor) -> torch.dtype:
    # Optimizer moments of bf16/fp16 adapters are kept at least in float32: squared LoRA
    # deltas of ~1e-4 underflow in half precision.
    return torch.promote_types(x.dtype, torch.float32)


def server_opt_init(x: TensorDict, cfg: ServerOptConfig) -> tuple[TensorDict, TensorDict]:
    """Initial optimizer state ``(m_{-1}, v_{-1}) = (0, v_init)`` shaped like ``x``.

    Args:
        x: The global parameters.
        cfg: The optimizer settings.

    Returns:
        ``(m, v)`` in at least float32.
    """
    v_init = float(cfg.v_init or 0.0)
    m = {k: torch.zeros(t.shape, dtype=_state_dtype(t), device=t.device) for k, t in x.items()}
    v = {
        k: torch.full(t.shape, v_init, dtype=_state_dtype(t), device=t.device) for k, t in x.items()
    }
    return m, v


def server_opt_step(
    x: TensorDict,
    delta: TensorDict,
    m: TensorDict,
    v: TensorDict,
    cfg: ServerOptConfig,
) -> tuple[TensorDict, TensorDict, TensorDict]:
    """One FedOPT server step (Reddi et al. 2021, Algorithm 2, lines after the client loop).

    Computed in float64; ``x_new`` keeps ``x``'s dtypes, ``m_new``/``v_new`` those of
    ``m``/``v``. For ``sgd``, ``v`` is returned unchanged.

    Args:
        x: Global parameters ``x_t``.
        delta: Weighted mean of the client updates ``y_i - x_t`` (see ``weighted_mean`` and
            ``deltas``).
        m: First moment ``m_{t-1}``.
        v: Second moment ``v_{t-1}``.
        cfg: Optimizer settings.

    Returns:
        ``(x_{t+1}, m_t, v_t)`` as new state dicts.

    Raises:
        UpdateRejected: The four state dicts do not share keys and shapes.
    """
    check_same_layout([x, delta, m, v], names=("x", "delta", "m", "v"), check_dtype=False)
    f64 = torch.float64
    b1, b2, eta, tau = cfg.beta1, cfg.beta2, cfg.eta, cfg.tau
    x_new: TensorDict = {}
    m_new: TensorDict = {}
    v_new: TensorDict = {}
    for key, x_t in x.items():
        d = delta[key].to(f64)
        m_t = b1 * m[key].to(f64) + (1.0 - b1) * d
        if cfg.kind == "sgd":
            v_t = v[key].to(f64)
            step = eta * m_t
        else:
            v_prev = v[key].to(f64)
            d2 = d * d
            if cfg.kind == "adagrad":
                v_t = v_prev + d2
            elif cfg.kind == "adam":
                v_t = b2 * v_prev + (1.0 - b2) * d2
            else:  # yogi
                v_t = v_prev - (1.0 - b2) * d2 * torch.sign(v_prev - d2)
            step = eta * m_t / (torch.sqrt(v_t) + tau)
        x_new[key] = (x_t.to(f64) + step).to(x_t.dtype)
        m_new[key] = m_t.to(m[key].dtype)
        v_new[key] = v_t.to(v[key].dtype)
    return x_new, m_new, v_new
