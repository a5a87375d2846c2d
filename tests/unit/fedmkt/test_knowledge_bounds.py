"""A tenant's knowledge message is refused when any value is one no model could produce
(paper 003's DualMinCE picks the lower CE, so a forged CE would win every sample)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from fedtune.algorithms.fedmkt.knowledge import FIELDS, Knowledge, value_problems


def _valid(seed: int = 0, samples: int = 4, k: int = 3) -> dict[str, torch.Tensor]:
    """Knowledge of a random model on random samples, built as compute_knowledge builds it."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 9, size=samples)
    tokens = rng.integers(0, 50, size=int(lengths.sum())).astype(np.int32)
    positions, offsets = [], [0]
    for n in lengths:
        own = np.arange(1, n)
        positions.append(own)
        offsets.append(offsets[-1] + len(own))
    p = int(offsets[-1])
    logits = torch.from_numpy(rng.normal(size=(p, 50)))
    top = torch.log_softmax(logits, dim=1).topk(k, dim=1)
    knowledge = Knowledge(
        sample=rng.permutation(10)[:samples].astype(np.int32),
        ce=rng.uniform(0.1, 3.0, size=samples).astype(np.float32),
        tokens=tokens,
        token_offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        positions=np.concatenate(positions).astype(np.int32),
        position_offsets=np.asarray(offsets, dtype=np.int64),
        topk_ids=top.indices.numpy().astype(np.int32),
        topk_logprobs=top.values.numpy().astype(np.float16),
    )
    return {name: torch.from_numpy(np.ascontiguousarray(getattr(knowledge, name))) for name in FIELDS}


def _set(field: str, index: tuple[int, ...], value: float) -> Callable[[dict[str, torch.Tensor]], None]:
    def change(t: dict[str, torch.Tensor]) -> None:
        t[field][index] = value

    return change


CORRUPTIONS: dict[str, tuple[Callable[[dict[str, torch.Tensor]], None], str]] = {
    "negative ce": (_set("ce", (1,), -0.5), "negative value"),
    "nan ce": (_set("ce", (0,), float("nan")), "ce holds NaN/Inf"),
    "-inf ce": (_set("ce", (2,), float("-inf")), "ce holds NaN/Inf"),
    "positive log-prob": (_set("topk_logprobs", (0, 0), 0.5), "positive log-probability"),
    "inf log-prob": (_set("topk_logprobs", (1, 1), float("-inf")), "topk_logprobs holds NaN/Inf"),
    "mass over 1": (_set("topk_logprobs", (2,), -0.1), "sum to"),
    "offsets not from 0": (_set("token_offsets", (0,), 1), "token_offsets do not cut"),
    "offsets past the end": (_set("position_offsets", (-1,), 10_000), "position_offsets do not cut"),
    "position 0": (_set("positions", (0,), 0), "positions of sample row 0"),
    "position past its sample": (_set("positions", (0,), 500), "positions of sample row 0"),
    "negative sample": (_set("sample", (1,), -1), "sample indices"),
}


@pytest.mark.parametrize("seed", range(5))
def test_knowledge_a_model_produces_is_in_bounds(seed: int) -> None:
    assert value_problems(_valid(seed)) == []


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
@pytest.mark.parametrize("seed", range(3))
def test_every_out_of_bounds_value_is_named(name: str, seed: int) -> None:
    tensors = _valid(seed)
    change, expected = CORRUPTIONS[name]
    change(tensors)
    problems = value_problems(tensors)
    assert any(expected in p for p in problems), problems


def test_a_repeated_sample_index_is_refused() -> None:
    tensors = _valid(1)
    tensors["sample"][1] = tensors["sample"][0]
    assert any("repeated" in p for p in value_problems(tensors))
