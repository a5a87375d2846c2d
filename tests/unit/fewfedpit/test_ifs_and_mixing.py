"""IFS against a hand computation, IFS selection, and the local aggregation of line 9."""

from __future__ import annotations

import math

import pytest
import torch

from fedtune.algorithms.fewfedpit.client import local_aggregation, select_by_ifs
from fedtune.algorithms.fewfedpit.ifs import instruction_following_score
from fedtune.data.formats import Example
from fedtune.data.templates import render_prompt
from fedtune.models import load_tokenizer
from tests.helpers.models import tiny_llama_for


@pytest.fixture(scope="module")
def tiny() -> tuple[torch.nn.Module, object]:
    tokenizer = load_tokenizer("builtin")
    model = tiny_llama_for(tokenizer, seed=3)
    return model.eval(), tokenizer


def _mean_nll(model: torch.nn.Module, context: list[int], target: list[int]) -> float:
    """Token by token: -log p(target_t | context, target_<t), one forward pass per token."""
    total = 0.0
    for t, token in enumerate(target):
        ids = torch.tensor([context + target[:t]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, -1].double()
        total -= float(torch.log_softmax(logits, dim=-1)[token])
    return total / len(target)


def test_ifs_equals_the_ratio_of_conditional_and_unconditional_losses(tiny) -> None:
    model, tokenizer = tiny
    instruction, given, response = "Reverse the given word.", "stone", "enots"
    prompt = render_prompt(Example(instruction=instruction, input=given, response=response))
    bos = [tokenizer.bos_token_id]
    target = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    with_prompt = _mean_nll(model, bos + tokenizer(prompt, add_special_tokens=False)["input_ids"], target)
    alone = _mean_nll(model, bos, target)
    got = instruction_following_score(model, tokenizer, instruction, response, given)
    assert got == pytest.approx(with_prompt / alone, rel=1e-5)
    assert math.isfinite(got) and got > 0


def test_select_by_ifs_keeps_the_lowest_in_generation_order() -> None:
    candidates = [Example(f"task {i}", "", "r") for i in range(5)]
    scores = {"task 0": 0.9, "task 1": 0.2, "task 2": 0.5, "task 3": 0.1, "task 4": 0.5}
    kept, kept_scores = select_by_ifs(candidates, lambda e: scores[e.instruction], 3)
    assert [e.instruction for e in kept] == ["task 1", "task 2", "task 3"]  # ties: earlier wins
    assert kept_scores == [0.2, 0.5, 0.1]


def test_local_aggregation_mixes_and_is_exact_at_the_ends() -> None:
    generator = torch.Generator().manual_seed(0)
    private = {"a": torch.randn(3, 4, generator=generator), "b": torch.randn(5, generator=generator)}
    public = {"a": torch.randn(3, 4, generator=generator), "b": torch.randn(5, generator=generator)}
    half = local_aggregation(private, public, 0.5)
    torch.testing.assert_close(half["a"], 0.5 * private["a"] + 0.5 * public["a"])
    assert all(torch.equal(local_aggregation(private, public, 1.0)[k], private[k]) for k in private)
    assert all(torch.equal(local_aggregation(private, public, 0.0)[k], public[k]) for k in public)
    with pytest.raises(ValueError, match="adapter names differ"):
        local_aggregation(private, {"a": public["a"]}, 0.5)
