"""FedPT's black-box large model and proxy-tuned decoding (paper 002, Eq. 3).

The provider's large model is reached only through :class:`LogitSource`: "next-token logits
for these token ids". It is never trained and never leaves the provider. The proxy-tuned
large model is

    z_proxy(x) = z_large(x) + alpha * (z_small_ft(x) - z_small_pre(x))          (Eq. 3)

over a vocabulary all three models share (checked by :func:`check_same_vocabulary`).
:func:`proxy_logits` scores padded batches (distillation, evaluation); :func:`generate`
decodes token by token, each model with its own KV cache where it has one (a Hugging Face
model) and by recomputation where it has none (an HTTP endpoint is stateless).

The arithmetic that the serving model needs lives in :mod:`fedtune.models.proxy_decoding`
(torch only, shipped inside the registered model); this module adds the sources.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from fedtune.core.errors import ConfigError
from fedtune.models.proxy_decoding import (
    CachedDecoder,
    Decoder,
    RecomputeDecoder,
    combine,
    device_of,
    generate_tokens,
)

__all__ = [
    "LogitSource",
    "ModelLogits",
    "ProxyTunedLM",
    "check_same_vocabulary",
    "generate",
    "proxy_logits",
]

log = logging.getLogger(__name__)


@runtime_checkable
class LogitSource(Protocol):
    """A model known only by its next-token logits."""

    #: Shown in errors and logs (a model path, "tiny", or the endpoint URL).
    name: str

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Float32 logits (B, T, V): position t scores the token after ``input_ids[:, t]``.

        ``attention_mask`` marks real tokens (1) and right padding (0); logits at padded
        positions are unspecified.
        """
        ...

    def decoder(self) -> Decoder:
        """A fresh incremental decoder for one sequence."""
        ...


class ModelLogits:
    """A local Hugging Face causal LM as a :class:`LogitSource` (KV-cached decoding)."""

    def __init__(self, model: torch.nn.Module, vocab_size: int | None = None, name: str = "") -> None:
        self.model = model
        self.vocab_size = vocab_size
        self.name = name or type(model).__name__
        self.calls = 0  # forward passes over batches (what a cache saves)

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Float32 logits on the inputs' device, whatever the model's device and dtype."""
        self.calls += 1
        device = device_of(self.model)
        out = self.model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device))
        logits: torch.Tensor = out.logits[..., : self.vocab_size] if self.vocab_size else out.logits
        return logits.to(device=input_ids.device, dtype=torch.float32)

    def decoder(self) -> Decoder:
        return CachedDecoder(self.model, self.vocab_size)


def as_source(model: LogitSource | torch.nn.Module) -> LogitSource:
    """Wrap a plain module; pass a :class:`LogitSource` through."""
    if isinstance(model, torch.nn.Module):
        return ModelLogits(model)
    return model


def check_same_vocabulary(
    small: Mapping[str, int], large: Mapping[str, int], *, small_name: str, large_name: str
) -> None:
    """Refuse models whose tokenizers differ: Eq. 3 adds logits index by index.

    Raises:
        ConfigError: The vocabularies differ; names both sizes and the first differing token.
    """
    if dict(small) == dict(large):
        return
    small_by_id = {i: t for t, i in small.items()}
    large_by_id = {i: t for t, i in large.items()}
    first = next(
        i
        for i in range(max(len(small_by_id), len(large_by_id)) + 1)
        if small_by_id.get(i) != large_by_id.get(i)
    )
    raise ConfigError(
        f"the small model's vocabulary ({len(small)} tokens, {small_name}) differs from the "
        f"large model's ({len(large)} tokens, {large_name}): token id {first} is "
        f"{small_by_id.get(first)!r} in the small and {large_by_id.get(first)!r} in the large",
        fix="FedPT adds the models' logits token by token (Eq. 3): pick a small and a large "
        "model of one family that share a tokenizer (e.g. GPT-2 760M with GPT-2 1.5B).",
    )


def check_alpha(alpha: float) -> float:
    """``alpha`` as a finite float.

    Raises:
        ConfigError: ``alpha`` is not a finite number.
    """
    try:
        value = float(alpha)
    except (TypeError, ValueError):
        value = float("nan")
    if not torch.isfinite(torch.tensor(value)):
        raise ConfigError(
            f"alpha={alpha!r} is not a finite number",
            fix="Set algorithm.alpha to a finite weight such as 1.0 (0 gives the large model).",
        )
    return value


def proxy_logits(
    large: LogitSource | torch.nn.Module,
    small_pre: LogitSource | torch.nn.Module,
    small_ft: LogitSource | torch.nn.Module,
    input_ids: torch.Tensor,
    alpha: float,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eq. 3 on a batch: ``z_large + alpha * (z_small_ft - z_small_pre)``, float32 (B, T, V).

    With ``alpha == 0`` this is exactly the large model's logits (no arithmetic is done).
    """
    alpha = check_alpha(alpha)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    z_large = as_source(large).logits(input_ids, attention_mask)
    if alpha == 0.0:
        return z_large
    z_pre = as_source(small_pre).logits(input_ids, attention_mask)
    z_ft = as_source(small_ft).logits(input_ids, attention_mask)
    return combine(z_large, z_pre, z_ft, alpha)


def generate(
    large: LogitSource | torch.nn.Module,
    small_pre: LogitSource | torch.nn.Module,
    small_ft: LogitSource | torch.nn.Module,
    input_ids: torch.Tensor | list[int],
    alpha: float,
    *,
    max_new_tokens: int,
    eos_token_id: int | None = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> list[int]:
    """Decode one sequence from the proxy-tuned model; returns the new token ids.

    ``temperature == 0`` is greedy decoding; otherwise tokens are sampled from
    ``softmax(z_proxy / temperature)`` restricted to the ``top_p`` nucleus, with a generator
    seeded by ``seed``. Stops after ``eos_token_id`` (included) or ``max_new_tokens``.
    """
    alpha = check_alpha(alpha)
    ids = torch.as_tensor(input_ids, dtype=torch.long).reshape(1, -1)
    decoders = [as_source(m).decoder() for m in (large, small_pre, small_ft)]
    return generate_tokens(
        decoders,
        ids,
        alpha,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_id,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
    )


def recompute_decoder(source: LogitSource) -> Decoder:
    """A decoder that rescores the whole prefix each step (for sources without a cache)."""
    return RecomputeDecoder(source.logits)


class ProxyTunedLM(torch.nn.Module):
    """The proxy-tuned large model (Eq. 3) as a causal LM, for evaluation code that expects one.

    ``forward`` returns an object with ``.logits``; ``generate`` is batched greedy decoding
    over left-padded prompts (what :func:`fedtune.eval.generation.generate_greedy` calls).
    Positions follow the attention mask, so a prompt decodes the same whatever its
    batch-mates. Each step rescores the whole prefix (no cache): meant for tests and
    benchmarks; :func:`generate` is the cached path for one sequence.
    """

    def __init__(
        self, large: torch.nn.Module, small_pre: torch.nn.Module, small_ft: torch.nn.Module, alpha: float
    ) -> None:
        super().__init__()
        self.large, self.small_pre, self.small_ft = large, small_pre, small_ft
        self.alpha = check_alpha(alpha)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_: Any
    ) -> Any:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        logits = []
        for m in (self.large, self.small_pre, self.small_ft):
            device = device_of(m)
            out = m(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                    position_ids=positions.to(device))
            logits.append(out.logits.to(input_ids.device))
        z_large, z_pre, z_ft = logits
        return _Output(combine(z_large, z_pre, z_ft, self.alpha))

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        max_new_tokens: int,
        eos_token_id: int | None = None,
        pad_token_id: int = 0,
        **_: Any,
    ) -> torch.Tensor:
        ids, mask = input_ids, attention_mask
        done = torch.zeros(ids.shape[0], dtype=torch.bool)
        for _step in range(max_new_tokens):
            token = self(ids, mask).logits[:, -1].argmax(-1)
            token = torch.where(done, torch.full_like(token, pad_token_id), token)
            ids = torch.cat([ids, token[:, None]], dim=1)
            mask = torch.cat([mask, (~done).long()[:, None]], dim=1)
            if eos_token_id is not None:
                done |= token == eos_token_id
            if bool(done.all()):
                break
        return ids


class _Output:
    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits


def describe(source: Any) -> str:
    """A short label of a source for logs."""
    return str(getattr(source, "name", type(source).__name__))
