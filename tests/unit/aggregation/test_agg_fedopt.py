"""FedOPT server optimizers (Reddi et al. 2021, Algorithm 2) against hand-computed rounds.

The expected numbers were computed with plain Python floats from the paper's update rules,
independently of the code under test; the arithmetic is written beside each value.
Shared setting: x0 = [1.0, -2.0], eta = 0.1, beta1 = 0.9, beta2 = 0.99, tau = 1e-3,
v_-1 = tau^2 = 1e-6, round deltas d1 = [0.5, -0.2] and d2 = [-0.01, 0.3].
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fedtune.aggregation import (
    ServerOptConfig,
    deltas,
    server_opt_init,
    server_opt_step,
    weighted_mean,
)
from fedtune.core.errors import ConfigError, UpdateRejected

X0 = [1.0, -2.0]
D1 = [0.5, -0.2]
D2 = [-0.01, 0.3]

# m is the same for every adaptive kind: m1 = 0.1*d1, m2 = 0.9*m1 + 0.1*d2
M1 = [0.05, -0.02]
M2 = [0.044, 0.012]

EXPECTED = {
    # adagrad: v1 = 1e-6 + d1^2; v2 = v1 + d2^2; x += 0.1 * m / (sqrt(v) + 1e-3)
    "adagrad": {
        "v1": [0.250001, 0.040001],
        "x1": [1.00998001999998, -2.009950124999219],  # 1 + 0.1*0.05/(sqrt(.250001)+.001)
        "v2": [0.250101, 0.130001],
        "x2": [1.0187606851544169, -2.0066311417903493],
    },
    # adam: v1 = 0.99*1e-6 + 0.01*d1^2; v2 = 0.99*v1 + 0.01*d2^2
    "adam": {
        "v1": [0.00250099, 0.00040099],
        "x1": [1.0980201901209485, -2.0951260516755887],
        "v2": [0.0024769801, 0.0012969801],
        "x2": [1.1846867921560547, -2.0627055446687055],
    },
    # yogi: v1 = 1e-6 + 0.01*d1^2 (v0 < d1^2, sign -1);
    # round 2: coord 0 has v1 = .002501 > d2^2 = 1e-4 (sign +1): v2 = .002501 - 1e-6 = .0025;
    #          coord 1 has v1 = .000401 < d2^2 = .09   (sign -1): v2 = .000401 + .0009 = .001301
    "yogi": {
        "v1": [0.002501, 0.000401],
        "x1": [1.0980199980004, -2.095124921972504],
        "v2": [0.0025, 0.001301],
        "x2": [1.1842945078043214, -2.062753188809049],
    },
}


def _state(values: list[float]) -> dict[str, torch.Tensor]:
    return {"w": torch.tensor(values, dtype=torch.float64)}


@pytest.mark.parametrize("kind", ["adagrad", "adam", "yogi"])
def test_two_rounds_match_hand_computation(kind: str) -> None:
    cfg = ServerOptConfig(kind=kind, eta=0.1, beta1=0.9, beta2=0.99, tau=1e-3)  # type: ignore[arg-type]
    x = _state(X0)
    m, v = server_opt_init(x, cfg)
    x, m, v = server_opt_step(x, _state(D1), m, v, cfg)
    exp = EXPECTED[kind]
    torch.testing.assert_close(m["w"], _state(M1)["w"], rtol=0, atol=1e-15)
    torch.testing.assert_close(v["w"], _state(exp["v1"])["w"], rtol=1e-12, atol=0)
    torch.testing.assert_close(x["w"], _state(exp["x1"])["w"], rtol=1e-12, atol=0)
    x, m, v = server_opt_step(x, _state(D2), m, v, cfg)
    torch.testing.assert_close(m["w"], _state(M2)["w"], rtol=0, atol=1e-15)
    torch.testing.assert_close(v["w"], _state(exp["v2"])["w"], rtol=1e-12, atol=0)
    torch.testing.assert_close(x["w"], _state(exp["x2"])["w"], rtol=1e-12, atol=0)


def test_no_bias_correction_on_the_first_adam_step() -> None:
    # With bias correction the first step would be ~eta*sign(d) = 0.1; without it (the paper)
    # the step is eta * 0.1*d / (sqrt(0.01*d^2 + 0.99*tau^2) + tau) ~= 0.098 for d = 0.5.
    cfg = ServerOptConfig(kind="adam", eta=0.1)
    x = _state([0.0])
    m, v = server_opt_init(x, cfg)
    x1, _, _ = server_opt_step(x, _state([0.5]), m, v, cfg)
    assert x1["w"].item() == pytest.approx(0.1 * 0.05 / ((0.01 * 0.25 + 0.99e-6) ** 0.5 + 1e-3))


def test_sgd_with_eta_one_and_no_momentum_is_fedavg() -> None:
    x = {"a": torch.tensor([0.2, -0.4]), "b": torch.tensor([[1.0, 2.0]])}
    clients = [
        {"a": torch.tensor([0.5, 0.0]), "b": torch.tensor([[1.5, 1.0]])},
        {"a": torch.tensor([-0.1, 0.3]), "b": torch.tensor([[0.0, 4.0]])},
        {"a": torch.tensor([0.9, -1.0]), "b": torch.tensor([[2.0, 2.5]])},
    ]
    counts = [10, 30, 60]
    cfg = ServerOptConfig(kind="sgd", eta=1.0, beta1=0.0)
    m, v = server_opt_init(x, cfg)
    delta = weighted_mean(deltas(clients, x), counts)
    x_new, _, _ = server_opt_step(x, delta, m, v, cfg)
    fedavg = weighted_mean(clients, counts)
    for key in x:
        torch.testing.assert_close(x_new[key], fedavg[key], rtol=0, atol=1e-6)


def test_sgd_momentum_two_rounds() -> None:
    # eta=2, beta1=0.5: m1 = 0.5*1.0 = 0.5, x1 = 0 + 2*0.5 = 1.0;
    # m2 = 0.5*0.5 + 0.5*(-3.0) = -1.25, x2 = 1.0 + 2*(-1.25) = -1.5
    cfg = ServerOptConfig(kind="sgd", eta=2.0, beta1=0.5)
    x = _state([0.0])
    m, v = server_opt_init(x, cfg)
    x, m, v = server_opt_step(x, _state([1.0]), m, v, cfg)
    assert (x["w"].item(), m["w"].item()) == (1.0, 0.5)
    x, m, v = server_opt_step(x, _state([-3.0]), m, v, cfg)
    assert (x["w"].item(), m["w"].item()) == (-1.5, -1.25)


def test_v_init_defaults_to_tau_squared_and_can_be_zero() -> None:
    assert ServerOptConfig(kind="yogi", eta=0.01, tau=1e-2).v_init == pytest.approx(1e-4)
    cfg0 = ServerOptConfig(kind="adam", eta=0.1, v_init=0.0)
    assert cfg0.v_init == 0.0
    _, v = server_opt_init(_state([1.0, 2.0]), cfg0)
    assert v["w"].tolist() == [0.0, 0.0]
    # v_-1 = 0: x1 = 0.1 * 0.05 / (sqrt(0.01 * 0.25) + 1e-3) = 0.005 / 0.051
    m, v = server_opt_init(_state([0.0]), cfg0)
    x1, _, _ = server_opt_step(_state([0.0]), _state([0.5]), m, v, cfg0)
    assert x1["w"].item() == pytest.approx(0.005 / 0.051, rel=1e-12)


def test_optimizer_state_of_bf16_parameters_is_float32() -> None:
    x = {"w": torch.ones(2, dtype=torch.bfloat16)}
    cfg = ServerOptConfig(kind="adam", eta=0.1)
    m, v = server_opt_init(x, cfg)
    assert m["w"].dtype == torch.float32 and v["w"].dtype == torch.float32
    # 1e-4 squared is 1e-8, which is below bfloat16's resolution near v_init
    delta = {"w": torch.full((2,), 1e-4, dtype=torch.bfloat16)}
    x1, _, v1 = server_opt_step(x, delta, m, v, cfg)
    assert x1["w"].dtype == torch.bfloat16
    assert v1["w"].dtype == torch.float32 and float(v1["w"][0]) > 0.99e-6


def test_config_is_frozen() -> None:
    cfg = ServerOptConfig(kind="adam", eta=0.1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.eta = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        pytest.param({"kind": "adamw", "eta": 0.1}, "kind='adamw'", id="kind"),
        pytest.param({"kind": "adam", "eta": 0.0}, "eta=0.0", id="eta"),
        pytest.param({"kind": "adam", "eta": 0.1, "beta1": 1.0}, "beta1=1.0", id="beta1"),
        pytest.param({"kind": "yogi", "eta": 0.1, "beta2": -0.1}, "beta2=-0.1", id="beta2"),
        pytest.param({"kind": "adagrad", "eta": 0.1, "tau": 0.0}, "tau=0.0", id="tau"),
        pytest.param({"kind": "adam", "eta": 0.1, "v_init": -1.0}, "v_init=-1.0", id="v_init"),
    ],
)
def test_invalid_config_is_rejected(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        ServerOptConfig(**kwargs)  # type: ignore[arg-type]
    assert needle in str(info.value)
    assert "tau**2" in info.value.fix


def test_sgd_accepts_tau_zero() -> None:
    assert ServerOptConfig(kind="sgd", eta=1.0, tau=0.0).tau == 0.0


def test_step_rejects_mismatched_state() -> None:
    cfg = ServerOptConfig(kind="adam", eta=0.1)
    x = _state([0.0, 1.0])
    m, v = server_opt_init(x, cfg)
    with pytest.raises(UpdateRejected, match="delta"):
        server_opt_step(x, _state([0.0]), m, v, cfg)
