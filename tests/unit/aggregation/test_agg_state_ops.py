"""Weighted means and state-dict arithmetic, checked against hand-computed numbers."""

from __future__ import annotations

import pytest
import torch

from fedtune.aggregation import add, deltas, scale, sub, weighted_mean, zeros_like
from fedtune.core.errors import QuorumError, UpdateRejected


def t(*values: float, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def test_unequal_sample_counts_weight_the_mean() -> None:
    a = {"lora_A": t(1.0, 2.0), "lora_B": t(-4.0)}
    b = {"lora_A": t(3.0, 6.0), "lora_B": t(8.0)}
    out = weighted_mean([a, b], [1, 3])
    # (1*1 + 3*3)/4 = 2.5, (1*2 + 3*6)/4 = 5.0, (1*-4 + 3*8)/4 = 5.0
    assert out["lora_A"].tolist() == [2.5, 5.0]
    assert out["lora_B"].tolist() == [5.0]


def test_equal_counts_give_the_plain_average() -> None:
    a = {"w": t(0.0, 10.0)}
    b = {"w": t(1.0, 20.0)}
    assert weighted_mean([a, b], [5, 5])["w"].tolist() == [0.5, 15.0]


def test_zero_weight_client_does_not_count() -> None:
    a = {"w": t(1.0)}
    b = {"w": t(100.0)}
    assert weighted_mean([a, b], [2, 0])["w"].tolist() == [1.0]


def test_one_client_is_returned_bitwise_as_a_copy() -> None:
    gen = torch.Generator().manual_seed(0)
    state = {"a": torch.randn(3, 4, generator=gen), "b": torch.randn(5, generator=gen).bfloat16()}
    out = weighted_mean([state], [7])
    for key, value in state.items():
        assert out[key].dtype == value.dtype
        assert torch.equal(out[key], value)
    out["a"].zero_()
    assert not torch.equal(out["a"], state["a"])  # the input was not aliased


def test_dtype_is_kept_and_half_precision_does_not_overflow() -> None:
    # 60000 is representable in float16 but 60000 + 60000 is not: a float16 accumulator
    # would produce inf; the float64 accumulator returns the exact mean.
    a = {"w": torch.tensor([60000.0], dtype=torch.float16)}
    b = {"w": torch.tensor([60000.0], dtype=torch.float16)}
    out = weighted_mean([a, b], [1, 1])
    assert out["w"].dtype == torch.float16
    assert out["w"].item() == 60000.0


def test_inputs_are_not_modified() -> None:
    a = {"w": t(1.0, 2.0)}
    b = {"w": t(3.0, 4.0)}
    weighted_mean([a, b], [1, 1])
    assert a["w"].tolist() == [1.0, 2.0] and b["w"].tolist() == [3.0, 4.0]


@pytest.mark.parametrize(
    ("states", "weights", "error", "needle"),
    [
        pytest.param([], [], QuorumError, "0 state dicts", id="empty"),
        pytest.param([{"w": t(1.0)}], [1, 2], UpdateRejected, "1 updates but 2 weights", id="len"),
        pytest.param(
            [{"w": t(1.0)}, {"v": t(1.0)}], [1, 1], UpdateRejected, "missing ['w']", id="keys"
        ),
        pytest.param(
            [{"w": t(1.0)}, {"w": t(1.0, 2.0)}], [1, 1], UpdateRejected, "shape (2,)", id="shape"
        ),
        pytest.param(
            [{"w": t(1.0)}, {"w": t(1.0, dtype=torch.float32)}],
            [1, 1],
            UpdateRejected,
            "dtype torch.float32",
            id="dtype",
        ),
        pytest.param(
            [{"w": t(1.0)}, {"w": t(2.0)}], [0, 0], UpdateRejected, "sum to 0", id="zero-total"
        ),
        pytest.param(
            [{"w": t(1.0)}, {"w": t(2.0)}], [3, -1], UpdateRejected, "weight -1", id="negative"
        ),
        pytest.param(
            [{"w": t(1.0)}, {"w": t(2.0)}],
            [1, float("nan")],
            UpdateRejected,
            "weight nan",
            id="nan-weight",
        ),
    ],
)
def test_weighted_mean_rejects_bad_input(
    states: list[dict[str, torch.Tensor]],
    weights: list[float],
    error: type[Exception],
    needle: str,
) -> None:
    with pytest.raises(error) as info:
        weighted_mean(states, weights)
    assert needle in str(info.value)


def test_errors_name_the_tenant_when_names_are_given() -> None:
    with pytest.raises(UpdateRejected, match="tenant 'acme'") as info:
        weighted_mean([{"w": t(1.0)}, {"w": t(1.0, 2.0)}], [1, 1], names=["beta", "acme"])
    assert info.value.fix  # every user-facing error says what to do


def test_arithmetic_helpers() -> None:
    a = {"w": t(1.0, 2.0)}
    b = {"w": t(0.5, -1.0)}
    assert add(a, b)["w"].tolist() == [1.5, 1.0]
    assert sub(a, b)["w"].tolist() == [0.5, 3.0]
    assert scale(a, -2.0)["w"].tolist() == [-2.0, -4.0]
    assert zeros_like(a)["w"].tolist() == [0.0, 0.0]
    assert [d["w"].tolist() for d in deltas([a, b], reference=b)] == [[0.5, 3.0], [0.0, 0.0]]


def test_sub_rejects_mismatched_keys() -> None:
    with pytest.raises(UpdateRejected, match="right operand"):
        sub({"w": t(1.0)}, {"v": t(1.0)})
