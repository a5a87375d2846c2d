"""IFS against a hand computation, IFS selection, and the local aggregation of line 9."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from tokenizers.processors import TemplateProcessing

from fedtune.algorithms.fewfedpit.client import local_aggregation, select_by_ifs
from fedtune.algorithms.fewfedpit.ifs import instruction_following_score, response_loss
from fedtune.data.formats import Example
from fedtune.data.templates import render_prompt
from fedtune.data.tokenize import encode_example
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


def _adds_bos(tokenizer: Any) -> Any:
    """A copy of ``tokenizer`` that adds BOS by itself, as Llama's does."""
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"{tokenizer.bos_token} $A", special_tokens=[(tokenizer.bos_token, tokenizer.bos_token_id)]
    )
    return tokenizer


def test_ifs_equals_the_ratio_of_conditional_and_unconditional_losses(tiny) -> None:
    model, tokenizer = tiny  # the builtin tokenizer adds no BOS, and training encodes none
    instruction, given, response = "Reverse the given word.", "stone", "enots"
    prompt = render_prompt(Example(instruction=instruction, input=given, response=response))
    target = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    with_prompt = _mean_nll(model, tokenizer(prompt, add_special_tokens=False)["input_ids"], target)
    alone = _mean_nll(model, target[:1], target[1:])  # no BOS: the first token is the context
    got = instruction_following_score(model, tokenizer, instruction, response, given)
    assert got == pytest.approx(with_prompt / alone, rel=1e-5)
    assert math.isfinite(got) and got > 0


@pytest.mark.parametrize("adds_bos", [False, True], ids=["no-bos", "adds-bos"])
def test_the_conditional_loss_is_the_examples_training_loss(tiny, adds_bos: bool) -> None:
    """IFS's L(y|x) reads the example as training encodes it (BOS exactly where the
    tokenizer adds one), so it is the loss the model is trained on for that example."""
    model, tokenizer = tiny
    tokenizer = _adds_bos(tokenizer) if adds_bos else tokenizer
    for example in (Example("Reverse the given word.", "stone", "enots"), Example("Say hi.", "", "hi there")):
        row = encode_example(example, tokenizer, 160)
        assert (row["input_ids"][0] == tokenizer.bos_token_id) == adds_bos
        with torch.no_grad():
            trained = model(input_ids=torch.tensor([row["input_ids"]]), labels=torch.tensor([row["labels"]])).loss
        got = response_loss(model, tokenizer, render_prompt(example), example.response)
        assert got == pytest.approx(float(trained), rel=1e-5)


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
