"""Client weights: by sample counts or uniform, and what uniform means for a mean."""

from __future__ import annotations

import pytest
import torch

from fedtune.aggregation import TensorSpec, client_weights, validate_update, weighted_mean
from fedtune.core.errors import UpdateRejected


def test_sample_weights_are_the_counts() -> None:
    assert client_weights("samples", [3, 1, 6]) == [3.0, 1.0, 6.0]


def test_uniform_weighting_is_the_plain_mean_whatever_the_claims() -> None:
    updates = [{"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([3.0, 10.0])}]
    claims = [1, 1_000_000]  # a tenant claiming a huge count cannot dominate
    mean = weighted_mean(updates, client_weights("uniform", claims))
    reference = (updates[0]["w"] + updates[1]["w"]) / 2  # independent: the arithmetic mean
    torch.testing.assert_close(mean["w"], reference)
    skewed = weighted_mean(updates, client_weights("samples", claims))
    assert not torch.allclose(skewed["w"], reference)


@pytest.mark.parametrize(("mode", "counts", "words"), [("median", [1], "unknown"), ("samples", [0, 2], "positive")])
def test_bad_weight_inputs_are_refused(mode: str, counts: list[int], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        client_weights(mode, counts)  # type: ignore[arg-type]


def test_an_update_in_another_dtype_than_the_broadcast_is_rejected() -> None:
    expected = {"adapter/a": TensorSpec((2, 2), torch.float32)}
    with pytest.raises(UpdateRejected, match="dtype torch.bfloat16, expected torch.float32"):
        validate_update("t", {"adapter/a": torch.zeros(2, 2, dtype=torch.bfloat16)}, expected, 10**6)
    validate_update("t", {"adapter/a": torch.zeros(2, 2)}, expected, 10**6)  # the right one passes
