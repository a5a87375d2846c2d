"""Every reason an update is rejected, and that a good update passes."""

from __future__ import annotations

import pytest
import torch

from fedtune.aggregation import validate_update
from fedtune.core.errors import UpdateRejected

EXPECTED = {"lora_A": (2, 4), "lora_B": (4, 2)}
LIMIT = 1024


def good() -> dict[str, object]:
    return {"lora_A": torch.zeros(2, 4), "lora_B": torch.ones(4, 2)}


def test_valid_update_passes() -> None:
    validate_update("acme", good(), EXPECTED, max_bytes=64)  # 16 float32 = 64 bytes exactly


def _with(**changes: object) -> dict[str, object]:
    update = good()
    for key, value in changes.items():
        if value is None:
            update.pop(key)
        else:
            update[key] = value
    return update


def _nan_inf() -> torch.Tensor:
    value = torch.zeros(4, 2)
    value[0, 0] = float("nan")
    value[1, 0] = float("nan")
    value[2, 1] = float("-inf")
    return value


@pytest.mark.parametrize(
    ("update", "max_bytes", "needles"),
    [
        pytest.param(_with(lora_B=None), LIMIT, ["missing keys 'lora_B'"], id="missing"),
        pytest.param(
            _with(extra=torch.zeros(1)), LIMIT, ["unexpected keys 'extra'"], id="unexpected"
        ),
        pytest.param(
            _with(lora_A=torch.zeros(4, 2)),
            LIMIT,
            ["'lora_A' has shape (4, 2), expected (2, 4)"],
            id="shape",
        ),
        pytest.param(
            _with(lora_B=torch.zeros(4, 2, dtype=torch.int64)),
            LIMIT,
            ["'lora_B' has non-floating dtype torch.int64"],
            id="dtype",
        ),
        pytest.param(
            _with(lora_B=_nan_inf()),
            LIMIT,
            ["'lora_B' has non-finite values (2 NaN, 1 Inf"],
            id="non-finite",
        ),
        pytest.param(
            good(), 63, ["total size 64 bytes exceeds the bound of 63 bytes"], id="too-big"
        ),
        pytest.param(
            _with(lora_A=[[0.0] * 4] * 2),
            LIMIT,
            ["'lora_A' is a list, not a tensor"],
            id="not-a-tensor",
        ),
    ],
)
def test_each_problem_is_named(
    update: dict[str, object], max_bytes: int, needles: list[str]
) -> None:
    with pytest.raises(UpdateRejected) as info:
        validate_update("acme", update, EXPECTED, max_bytes=max_bytes)
    message = str(info.value)
    assert "tenant 'acme'" in message
    for needle in needles:
        assert needle in message
    assert "acme" in info.value.fix


def test_all_problems_are_reported_at_once() -> None:
    update = {"lora_A": torch.full((3, 3), float("inf")), "junk": torch.zeros(1000)}
    with pytest.raises(UpdateRejected) as info:
        validate_update("globex", update, EXPECTED, max_bytes=100)
    message = str(info.value)
    for needle in (
        "missing keys 'lora_B'",
        "unexpected keys 'junk'",
        "'lora_A' has shape (3, 3), expected (2, 4)",
        "(0 NaN, 9 Inf of 9)",
        "exceeds the bound of 100 bytes",
    ):
        assert needle in message
