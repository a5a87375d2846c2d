"""limits.max_update_norm: the L2 norm of an update's change from the broadcast."""

from __future__ import annotations

import math

import pytest
import torch

from fedtune.aggregation.validation import check_update_norm
from fedtune.core.errors import UpdateRejected


def test_the_norm_is_of_the_change_and_counts_tensors_without_a_reference_whole() -> None:
    reference = {"adapter/a": torch.ones(4)}
    update = {"adapter/a": torch.ones(4) + torch.tensor([3.0, 0, 0, 0]), "control_delta/a": torch.tensor([4.0])}
    assert check_update_norm("t", update, reference, None) == pytest.approx(5.0)
    assert check_update_norm("t", update, reference, 5.0) == pytest.approx(5.0)


@pytest.mark.parametrize("value", [100.0, math.nan])
def test_over_the_bound_or_not_finite_is_rejected_naming_the_tenant(value: float) -> None:
    with pytest.raises(UpdateRejected, match=r"update of tenant 'tenant-b' rejected: its L2 norm of change") as info:
        check_update_norm("tenant-b", {"adapter/a": torch.tensor([value])}, {}, 1.0)
    assert "limits.max_update_norm" in info.value.fix
