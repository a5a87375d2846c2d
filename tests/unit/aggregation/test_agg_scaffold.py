"""SCAFFOLD control-variate maths (Karimireddy et al. 2020, Algorithm 1, option II)."""

from __future__ import annotations

import pytest
import torch

from fedtune.aggregation import (
    scaffold_client_correction,
    scaffold_new_client_variate,
    scaffold_server_update,
    weighted_mean,
)
from fedtune.core.errors import ConfigError, QuorumError, UpdateRejected


def s(*values: float) -> dict[str, torch.Tensor]:
    return {"w": torch.tensor(values, dtype=torch.float64)}


def close(a: dict[str, torch.Tensor], values: list[float]) -> None:
    torch.testing.assert_close(a["w"], s(*values)["w"], rtol=0, atol=1e-12)


def test_client_correction() -> None:
    # g - c_i + c = [1 - 0.5 + 0.25, 2 - 0.5 - 1]
    close(scaffold_client_correction(s(1.0, 2.0), s(0.5, 0.5), s(0.25, -1.0)), [0.75, 0.5])


def test_new_client_variate_option_two() -> None:
    # (x - y_i)/(K*lr) = [0.2, -0.1]/0.2 = [1.0, -0.5]; c_i - c = [-0.1, -0.2]
    out = scaffold_new_client_variate(
        c_i=s(0.1, 0.0), c=s(0.2, 0.2), x=s(1.0, 1.0), y_i=s(0.8, 1.1), local_steps=4, lr=0.05
    )
    close(out, [0.9, -0.7])


def test_server_update_applies_the_participation_fraction() -> None:
    # mean(y_i - x) = ([0.2, -0.2] + [-0.4, 0.4]) / 2 = [-0.1, 0.1]; x += 0.5 * that
    # mean(dc) = ([0.2, 0.0] + [-0.4, 0.6]) / 2 = [-0.1, 0.3]; c += (2/4) * that
    x_new, c_new = scaffold_server_update(
        x=s(1.0, 2.0),
        c=s(0.1, -0.1),
        y_list=[s(1.2, 1.8), s(0.6, 2.4)],
        dc_list=[s(0.2, 0.0), s(-0.4, 0.6)],
        n_total_clients=4,
        global_lr=0.5,
    )
    close(x_new, [0.95, 2.05])
    close(c_new, [0.05, 0.05])  # without |S|/N (FLARE) it would be [0.0, 0.2]


def test_first_round_with_zero_variates_equals_fedavg() -> None:
    x = s(0.0, 1.0)
    ys = [s(1.0, 3.0), s(-2.0, 0.0), s(4.0, 0.5)]
    zero = s(0.0, 0.0)
    x_new, c_new = scaffold_server_update(x, zero, ys, [zero] * 3, 3, 1.0)
    torch.testing.assert_close(x_new["w"], weighted_mean(ys, [1, 1, 1])["w"])
    close(c_new, [0.0, 0.0])
    # and the corrected gradient with zero variates is the plain gradient
    close(scaffold_client_correction(s(0.3, -0.7), zero, zero), [0.3, -0.7])


@pytest.mark.parametrize(
    ("kwargs", "error", "needle"),
    [
        pytest.param({"y_list": [], "dc_list": []}, QuorumError, "got 0", id="empty"),
        pytest.param({"dc_list": []}, UpdateRejected, "1 client models but 0", id="lengths"),
        pytest.param({"n_total_clients": 0}, ConfigError, "n_total_clients=0", id="n"),
        pytest.param({"global_lr": 0.0}, ConfigError, "global_lr=0.0", id="lr"),
        pytest.param({"y_list": [s(1.0)]}, UpdateRejected, "y_list[0] has shape", id="shape"),
    ],
)
def test_server_update_rejects_bad_input(
    kwargs: dict[str, object], error: type[Exception], needle: str
) -> None:
    args: dict[str, object] = {
        "x": s(1.0, 2.0),
        "c": s(0.0, 0.0),
        "y_list": [s(1.0, 1.0)],
        "dc_list": [s(0.0, 0.0)],
        "n_total_clients": 2,
        "global_lr": 1.0,
    }
    args.update(kwargs)
    with pytest.raises(error) as info:
        scaffold_server_update(**args)  # type: ignore[arg-type]
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("steps", "lr", "needle"),
    [pytest.param(0, 0.1, "local_steps=0", id="steps"), pytest.param(3, 0.0, "lr=0.0", id="lr")],
)
def test_new_client_variate_rejects_bad_settings(steps: int, lr: float, needle: str) -> None:
    z = s(0.0)
    with pytest.raises(ConfigError, match=needle):
        scaffold_new_client_variate(z, z, z, z, local_steps=steps, lr=lr)
