"""Proxy-tuned decoding, torch only (paper 002, Eq. 3).

This file imports nothing from fedtune on purpose: the registered FedPT model ships it
(MLflow ``code_paths``) and generates with it where fedtune is not installed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch


class Decoder(Protocol):
    """Next-token logits for one growing sequence."""

    def start(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits (V,) after the prompt ``input_ids`` (1, T)."""
        ...

    def advance(self, token: int) -> torch.Tensor:
        """Logits (V,) after appending ``token``."""
        ...


class CachedDecoder:
    """A Hugging Face causal LM with its KV cache: each step feeds one token."""

    def __init__(self, model: Any, vocab_size: int | None = None) -> None:
        self.model = model
        self.vocab_size = vocab_size
        self.past: Any = None
        self.length = 0
        # transformers 5 names the KV cache ``cache``; 4.x called it ``past_key_values``.
        params = inspect.signature(_forward_of(model)).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"

    def _logits(self, out: Any) -> torch.Tensor:
        self.past = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        logits = out.logits[0, -1]
        if self.vocab_size:
            logits = logits[: self.vocab_size]
        return logits.to(device="cpu", dtype=torch.float32)  # decoding picks tokens on the CPU

    @torch.no_grad()
    def start(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.length = int(input_ids.shape[1])
        input_ids = input_ids.to(device_of(self.model))
        mask = torch.ones_like(input_ids)
        return self._logits(self.model(input_ids=input_ids, attention_mask=mask, use_cache=True))

    @torch.no_grad()
    def advance(self, token: int) -> torch.Tensor:
        self.length += 1
        device = device_of(self.model)
        step = torch.tensor([[token]], dtype=torch.long, device=device)
        mask = torch.ones((1, self.length), dtype=torch.long, device=device)
        kwargs = {self.cache_arg: self.past}
        out = self.model(input_ids=step, attention_mask=mask, use_cache=True, **kwargs)
        return self._logits(out)


def device_of(model: Any) -> torch.device:
    """Where ``model``'s weights are (inputs go there; CPU for a parameterless module)."""
    first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return first.device if first is not None else torch.device("cpu")


def _forward_of(model: Any) -> Any:
    """The causal LM's own forward (a PEFT wrapper's forward only takes ``**kwargs``)."""
    get_base = getattr(model, "get_base_model", None)
    return (get_base() if callable(get_base) else model).forward


class RecomputeDecoder:
    """Any scorer of whole batches, rescoring the full prefix each step (no cache)."""

    def __init__(self, score: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        self.score = score
        self.ids: torch.Tensor | None = None

    def start(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.ids = input_ids
        return self.score(input_ids, torch.ones_like(input_ids))[0, -1].to(torch.float32)

    def advance(self, token: int) -> torch.Tensor:
        assert self.ids is not None, "start() first"
        self.ids = torch.cat([self.ids, torch.tensor([[token]], dtype=torch.long)], dim=1)
        return self.score(self.ids, torch.ones_like(self.ids))[0, -1].to(torch.float32)


def combine(
    z_large: torch.Tensor, z_pre: torch.Tensor, z_ft: torch.Tensor, alpha: float
) -> torch.Tensor:
    """Eq. 3: ``z_large + alpha * (z_ft - z_pre)`` in float32 (over the shortest vocabulary)."""
    size = min(z_large.shape[-1], z_pre.shape[-1], z_ft.shape[-1])
    z_large, z_pre, z_ft = (z[..., :size].to(torch.float32) for z in (z_large, z_pre, z_ft))
    if alpha == 0.0:
        return z_large
    return z_large + alpha * (z_ft - z_pre)


def pick(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator
) -> int:
    """Greedy (``temperature == 0``) or nucleus sampling from ``logits`` (V,)."""
    if temperature <= 0.0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator))


def generate_tokens(
    decoders: Sequence[Decoder],
    input_ids: torch.Tensor,
    alpha: float,
    *,
    max_new_tokens: int,
    eos_token_id: int | None = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> list[int]:
    """Decode from ``combine`` of three decoders (large, small pre-trained, small tuned)."""
    large, pre, ft = decoders
    generator = torch.Generator().manual_seed(seed)
    z = combine(large.start(input_ids), pre.start(input_ids), ft.start(input_ids), alpha)
    new: list[int] = []
    for _ in range(max_new_tokens):
        token = pick(z, temperature, top_p, generator)
        new.append(token)
        if token == eos_token_id or len(new) == max_new_tokens:
            break
        z = combine(large.advance(token), pre.advance(token), ft.advance(token), alpha)
    return new
