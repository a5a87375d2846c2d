"""Eq. 3 and proxy-tuned decoding, against computations written out independently."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from fedtune.algorithms.fedpt import proxy
from fedtune.algorithms.fedpt.config import FedPTConfig
from fedtune.core.errors import ConfigError
from fedtune.models.tiny import build_tiny_model
from fedtune.models.tokenizer import load_tokenizer

TOKENIZER = load_tokenizer("builtin")


def tiny(arch: str, seed: int, hidden: int = 32, layers: int = 2, sharpen: float = 8.0) -> torch.nn.Module:
    """A tiny model with peaked next-token distributions (fresh ones are nearly uniform)."""
    model = build_tiny_model(
        arch,
        vocab_size=len(TOKENIZER),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=128,
        seed=seed,
        bos_token_id=TOKENIZER.bos_token_id,
        eos_token_id=TOKENIZER.eos_token_id,
        pad_token_id=TOKENIZER.pad_token_id,
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn(param.shape, generator=generator))
        model.get_output_embeddings().weight.mul_(sharpen)
    return model.eval()


@pytest.fixture(params=["llama", "gpt2"])
def trio(request: pytest.FixtureRequest) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
    arch = request.param
    return tiny(arch, 1, hidden=64, layers=3), tiny(arch, 2), tiny(arch, 3)


def ids(text: str) -> torch.Tensor:
    return torch.tensor([TOKENIZER(text)["input_ids"]])


def test_proxy_logits_is_eq3_computed_independently(trio: tuple) -> None:
    large, pre, ft = trio
    x = ids("Give three tips for staying healthy.")
    with torch.no_grad():
        expected = large(x).logits + 0.7 * (ft(x).logits - pre(x).logits)
    got = proxy.proxy_logits(large, pre, ft, x, 0.7)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_alpha_zero_and_untuned_small_give_exactly_the_large_logits(trio: tuple) -> None:
    large, pre, ft = trio
    x = ids("Name a color.")
    with torch.no_grad():
        z_large = large(x).logits.float()
    assert torch.equal(proxy.proxy_logits(large, pre, ft, x, 0.0), z_large)
    assert torch.equal(proxy.proxy_logits(large, pre, pre, x, 2.5), z_large)


def test_cached_generation_equals_greedy_decoding_recomputed_from_scratch(trio: tuple) -> None:
    large, pre, ft = trio
    prompt = TOKENIZER("Write a short poem about the sea.")["input_ids"]
    alpha = 1.5
    got = proxy.generate(large, pre, ft, prompt, alpha, max_new_tokens=12)
    # Reference: every step runs all three models on the whole sequence, no cache.
    seq = list(prompt)
    expected: list[int] = []
    with torch.no_grad():
        for _ in range(12):
            x = torch.tensor([seq])
            z = large(x).logits[0, -1] + alpha * (ft(x).logits[0, -1] - pre(x).logits[0, -1])
            token = int(torch.argmax(z))
            expected.append(token)
            seq.append(token)
    assert got == expected
    assert len(set(got)) > 1  # the peaked models do not just repeat one token


def test_generation_stops_at_eos_and_sampling_is_seeded(trio: tuple) -> None:
    large, pre, ft = trio
    prompt = TOKENIZER("Hello")["input_ids"]
    greedy = proxy.generate(large, pre, ft, prompt, 1.0, max_new_tokens=6)
    stopped = proxy.generate(large, pre, ft, prompt, 1.0, max_new_tokens=6, eos_token_id=greedy[2])
    assert stopped == greedy[: greedy.index(greedy[2]) + 1]
    a = proxy.generate(large, pre, ft, prompt, 1.0, max_new_tokens=8, temperature=1.0, seed=3)
    b = proxy.generate(large, pre, ft, prompt, 1.0, max_new_tokens=8, temperature=1.0, seed=3)
    assert a == b and len(a) == 8
    # top_p close to 0 keeps only the most likely token: sampling becomes greedy.
    nucleus = proxy.generate(
        large, pre, ft, prompt, 1.0, max_new_tokens=6, temperature=1.0, top_p=1e-6, seed=9
    )
    assert nucleus == greedy


def test_recompute_decoder_matches_the_cached_one(trio: tuple) -> None:
    large, _, _ = trio
    source = proxy.ModelLogits(large)
    cached, recompute = source.decoder(), proxy.recompute_decoder(source)
    x = ids("Tell me a joke.")
    torch.testing.assert_close(cached.start(x), recompute.start(x), rtol=1e-5, atol=1e-4)
    for token in (5, 17, 42):
        torch.testing.assert_close(cached.advance(token), recompute.advance(token), rtol=1e-5, atol=1e-4)


def test_different_vocabularies_are_refused_naming_sizes_and_the_first_difference() -> None:
    small = {"a": 0, "b": 1, "c": 2}
    large = {"a": 0, "x": 1, "c": 2, "d": 3}
    with pytest.raises(ConfigError) as err:
        proxy.check_same_vocabulary(small, large, small_name="small", large_name="big")
    message = str(err.value)
    assert "3 tokens" in message and "4 tokens" in message
    assert "token id 1" in message and "'b'" in message and "'x'" in message
    proxy.check_same_vocabulary(small, dict(small), small_name="s", large_name="l")


@pytest.mark.parametrize("alpha", [math.nan, math.inf, -math.inf, "one"])
def test_alpha_must_be_a_finite_number(alpha: object) -> None:
    with pytest.raises(ConfigError, match="alpha=.* is not a finite number"):
        proxy.check_alpha(alpha)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        FedPTConfig(name="fedpt", alpha=alpha, large_model={"source": "tiny"})  # type: ignore[arg-type]


def test_proxy_tuned_lm_generates_what_single_sequence_decoding_does_in_a_padded_batch(trio: tuple) -> None:
    """Evaluation's batched greedy path (left padding, positions from the mask) equals Eq. 3
    decoding of each prompt alone."""
    from fedtune.eval.generation import generate_greedy

    large, pre, ft = trio
    prompts = ["Give three tips for staying healthy.", "Hi", "Name a colour"]
    lm = proxy.ProxyTunedLM(large, pre, ft, 0.7)
    got = generate_greedy(lm, TOKENIZER, prompts, 5, batch_size=3)
    for prompt, text in zip(prompts, got, strict=True):
        alone = proxy.generate(
            large, pre, ft, TOKENIZER(prompt)["input_ids"], 0.7, max_new_tokens=5,
            eos_token_id=TOKENIZER.eos_token_id,
        )
        if TOKENIZER.eos_token_id in alone:
            alone = alone[: alone.index(TOKENIZER.eos_token_id)]
        assert text == TOKENIZER.decode(alone, skip_special_tokens=True)
