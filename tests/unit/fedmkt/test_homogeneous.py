"""Homogeneous mode's check of an uploaded small-model adapter (``slm_adapter/*``)."""

from __future__ import annotations

import torch

from fedtune.algorithms.fedmkt.algorithm import _check_slm_adapter


def test_a_matching_adapter_passes() -> None:
    a = {"lora_A": torch.zeros(2, 3)}
    assert _check_slm_adapter(a, {}) == []
    assert _check_slm_adapter(a, {"lora_A": torch.ones(2, 3)}) == []


def test_missing_non_float_non_finite_and_misshapen_adapters_are_named() -> None:
    assert "no slm_adapter/* tensors" in _check_slm_adapter({}, {})[0]
    assert "not floating point" in _check_slm_adapter({"a": torch.zeros(2, dtype=torch.int32)}, {})[0]
    assert "NaN/Inf" in _check_slm_adapter({"a": torch.tensor([float("nan")])}, {})[0]
    assert "has shape (3,), the average (2,)" in _check_slm_adapter({"a": torch.zeros(3)}, {"a": torch.zeros(2)})[0]
    assert "differ from the broadcast average's" in _check_slm_adapter({"b": torch.zeros(2)}, {"a": torch.zeros(2)})[0]
