"""Each algorithm's ``aggregation_weights``: the paper's default, and both modes honoured by
its aggregation, against a hand computation of the mean."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from pydantic import TypeAdapter

from fedtune.algorithms.registry import get_algorithm
from fedtune.config.algorithms import AlgorithmConfig
from fedtune.core.messages import ServerState, Update, prefixed

X = torch.tensor([1.0, -2.0])
# Two tenants: 1 and 3 samples, updates y_a and y_b.
Y = {"a": torch.tensor([2.0, 0.0]), "b": torch.tensor([6.0, 4.0])}
SAMPLES = {"a": 1, "b": 3}
# By hand: samples -> (1 * y_a + 3 * y_b) / 4; uniform -> (y_a + y_b) / 2.
EXPECTED = {"samples": torch.tensor([5.0, 3.0]), "uniform": torch.tensor([4.0, 2.0])}

# name, extra config, paper default (the source is in the config class's docstring)
CASES: list[tuple[str, dict[str, Any], str]] = [
    ("fedavg", {}, "samples"),  # McMahan et al. 2017, Algorithm 1
    ("fedprox", {"mu": 0.1}, "samples"),  # Li et al. 2020 keep FedAvg's weights
    # Plain server SGD with eta 1 and no momentum: x + Delta = the weighted mean of the y_i.
    ("fedopt", {"server_optimizer": "sgd", "eta": 1.0, "beta1": 0.0}, "uniform"),  # Reddi et al. 2021, Alg. 2
    ("scaffold", {}, "uniform"),  # Karimireddy et al. 2020, Alg. 1 line 16
]


def _aggregate(name: str, fields: dict[str, Any]) -> tuple[Any, torch.Tensor]:
    config = TypeAdapter(AlgorithmConfig).validate_python({"name": name, **fields})
    algorithm = get_algorithm(name)(config)
    zeros = torch.zeros_like(X)
    state = ServerState(
        tensors=prefixed("adapter", {"w": X})
        | prefixed("m", {"w": zeros})
        | prefixed("v", {"w": zeros})
        | prefixed("control", {"w": zeros}),
        meta={"round": 0},
    )
    updates = {
        t: Update(
            tensors=prefixed("adapter", {"w": y}) | prefixed("control_delta", {"w": zeros}),
            meta={"num_samples": SAMPLES[t]},
        )
        for t, y in Y.items()
    }
    ctx = SimpleNamespace(num_tenants=2)
    after = algorithm.aggregate(ctx, state, updates, 1)
    return algorithm.config, after.group("adapter")["w"]


@pytest.mark.parametrize(("name", "fields", "default"), CASES)
def test_default_weights_follow_the_paper(name: str, fields: dict[str, Any], default: str) -> None:
    config, mean = _aggregate(name, fields)
    assert config.aggregation_weights == default
    torch.testing.assert_close(mean, EXPECTED[default])


@pytest.mark.parametrize(("name", "fields", "default"), CASES)
@pytest.mark.parametrize("mode", ["samples", "uniform"])
def test_both_weightings_are_honoured(name: str, fields: dict[str, Any], default: str, mode: str) -> None:
    _, mean = _aggregate(name, {**fields, "aggregation_weights": mode})
    torch.testing.assert_close(mean, EXPECTED[mode])
