"""limits.max_update_norm: the L2 norm of an update's change from the broadcast."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from fedtune.aggregation.validation import check_update_bound, check_update_norm
from fedtune.config.job import LimitsConfig
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


def _change(norm: float) -> dict[str, torch.Tensor]:
    """An update of the reference below whose change has L2 norm ``norm``."""
    return {"adapter/a": torch.tensor([3.0 + norm, 4.0])}


REFERENCE = {"adapter/a": torch.tensor([3.0, 4.0])}  # L2 norm 5


def test_by_default_the_bound_is_a_multiple_of_the_broadcasts_norm() -> None:
    limits = LimitsConfig()
    assert limits.max_update_norm_ratio == 1000.0
    assert check_update_bound("t", _change(4999.0), REFERENCE, limits) == pytest.approx(4999.0)
    with pytest.raises(UpdateRejected, match=r"tenant 'tenant-b' rejected: its L2 norm of change 5001 exceeds the "
                       r"bound 5000 = limits.max_update_norm_ratio=1000 times the broadcast's L2 norm 5$"):
        check_update_bound("tenant-b", _change(5001.0), REFERENCE, limits)


def test_a_finite_outlier_is_rejected_even_where_the_broadcast_is_zero() -> None:
    """1e30 squares past float32's range; the norm is taken in float64. A zero broadcast
    (nothing trained yet) counts as norm 1, so its bound is the ratio itself."""
    huge = {"adapter/a": torch.tensor([1e30, 0.0], dtype=torch.float32)}
    with pytest.raises(UpdateRejected, match=r"1e\+30 exceeds the bound 1000 = .* L2 norm 1$"):
        check_update_bound("t", huge, {"adapter/a": torch.zeros(2)}, LimitsConfig())


@pytest.mark.parametrize(
    ("limits", "relative", "bound"),
    [
        pytest.param({"max_update_norm_ratio": 10.0}, True, 50.0, id="ratio-overridden"),
        pytest.param({"max_update_norm_ratio": None}, True, None, id="ratio-off"),
        pytest.param({"max_update_norm": 7.0}, True, 7.0, id="absolute-wins"),
        pytest.param({"max_update_norm": 7.0, "max_update_norm_ratio": None}, True, 7.0, id="absolute-alone"),
        pytest.param({}, False, None, id="not-a-change-of-the-broadcast"),
        pytest.param({"max_update_norm": 7.0}, False, 7.0, id="absolute-for-any-update"),
    ],
)
def test_the_bound_can_be_overridden_or_turned_off(limits: dict[str, float | None], relative: bool,
                                                    bound: float | None) -> None:
    config = LimitsConfig.model_validate(limits)
    found = config.update_norm_bound(5.0, relative=relative)
    assert (found[0] if found else None) == bound
    huge = {"adapter/a": torch.tensor([1e30, 4.0])}
    if bound is None:
        assert check_update_bound("t", huge, REFERENCE, config, relative=relative) is None
    else:
        with pytest.raises(UpdateRejected):
            check_update_bound("t", huge, REFERENCE, config, relative=relative)


@pytest.mark.parametrize("ratio", [0.0, -1.0, 1e13])
def test_a_ratio_out_of_range_is_refused_naming_the_field(ratio: float) -> None:
    with pytest.raises(ValidationError, match="max_update_norm_ratio"):
        LimitsConfig.model_validate({"max_update_norm_ratio": ratio})
