"""FedPT's large model behind an OpenAI-style completions endpoint (a true black box).

The provider often cannot load its large model into the training stack at all: it serves it
(vLLM, TGI, an internal gateway) and can only ask for log-probabilities. This
:class:`~fedtune.algorithms.fedpt.proxy.LogitSource` sends the token ids as the prompt with
``echo`` and ``logprobs`` (the legacy completions API; vLLM implements it), and reads back,
for every prompt position, the top-k log-probabilities of the token that follows.

**Approximation.** Only the top ``top_k`` tokens of each position are returned. The remaining
probability mass ``1 - sum(top-k)`` is spread evenly over the other ``V - k`` tokens, so the
dense row is a proper log-distribution whose top-k entries are exact. Eq. 3 adds log-probs
here instead of raw logits, which is the same up to a per-position constant (softmax is
shift-invariant). The endpoint is stateless: decoding rescores the whole prefix each step.

Returned tokens are mapped to ids by the ``token_id:N`` form (vLLM's
``return_tokens_as_token_ids``, which we request) or else through the large model's
tokenizer; a token that maps to no single id is dropped (its mass joins the rest).
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any

import torch

from fedtune.algorithms.fedpt.config import LargeHttpConfig
from fedtune.core.errors import ModelError
from fedtune.core.http_retry import MaxRetryError, RetryingClient
from fedtune.models.proxy_decoding import Decoder, RecomputeDecoder

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
BACKOFF_S = 0.5  # urllib3's backoff factor: retries after 0, 1, 2, 4 ... s
MAX_ERROR_BODY = 500  # characters of an error response quoted in the message


class HttpLogitSource:
    """Next-token log-probabilities from an OpenAI-style ``/v1/completions`` endpoint.

    ``requests`` counts HTTP requests sent (retries included); ``calls`` counts
    :meth:`logits` calls (what the provider's log-prob cache saves).
    """

    def __init__(self, config: LargeHttpConfig, tokenizer: Any, *, backoff_s: float = BACKOFF_S) -> None:
        self.config = config
        self.name = config.url
        self.vocab_size = len(tokenizer)
        self._vocab: dict[str, int] = tokenizer.get_vocab()
        self._tokenizer = tokenizer
        self._backoff_s = backoff_s
        self.requests = 0
        self.calls = 0

    # -- LogitSource -----------------------------------------------------------------------
    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Dense float32 log-probs (B, T, V); padded positions are filled uniformly."""
        self.calls += 1
        batch, length = input_ids.shape
        out = torch.full((batch, length, self.vocab_size), -math.log(self.vocab_size))
        rows = [
            input_ids[b][attention_mask[b].bool()].tolist() for b in range(batch)
        ]
        step = self.config.batch_size
        for start in range(0, batch, step):
            chunk = rows[start : start + step]
            for offset, positions in enumerate(self._score(chunk)):
                for t, top in enumerate(positions):
                    out[start + offset, t] = self._dense(top)
        return out

    def decoder(self) -> Decoder:
        return RecomputeDecoder(self.logits)

    def probe(self) -> None:
        """Score one short prompt, so a wrong URL, model name or key fails before training.

        Raises:
            ModelError: The endpoint is unreachable or answers without prompt log-probs.
        """
        ids = self._tokenizer("probe")["input_ids"][:4] or [0]
        self._score([ids])

    # -- one request -------------------------------------------------------------------------
    def _score(self, prompts: list[list[int]]) -> list[list[dict[int, float]]]:
        """Per prompt, per position t: ``{token id: log p(token at t+1 | ids[:t+1])}``."""
        body = {
            "model": self.config.model,
            "prompt": prompts,
            "max_tokens": 1,  # the generated token's top-k is the last position's
            "echo": True,
            "logprobs": self.config.top_k,
            "temperature": 0,
            "return_tokens_as_token_ids": True,
        }
        reply = self._post(body)
        choices = reply.get("choices")
        if not isinstance(choices, list) or len(choices) != len(prompts):
            raise self._bad_reply(f"expected {len(prompts)} choices, got {_count(choices)}")
        choices = sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0)
        scored = []
        for prompt, choice in zip(prompts, choices, strict=True):
            top = (choice.get("logprobs") or {}).get("top_logprobs") if isinstance(choice, dict) else None
            # Entry j is the distribution of token j given tokens < j; entry 0 has none.
            if not isinstance(top, list) or len(top) < len(prompt) + 1:
                raise self._bad_reply(
                    f"expected top_logprobs for {len(prompt)} prompt tokens plus one generated "
                    f"token, got {_count(top)}"
                )
            scored.append([self._ids(entry) for entry in top[1 : len(prompt) + 1]])
        return scored

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST with retries on connection errors, timeouts, 408/429/5xx (urllib3's ``Retry``)."""
        headers = {"Content-Type": "application/json"}
        if self.config.api_key_env:
            key = os.environ.get(self.config.api_key_env)
            if not key:
                raise ModelError(
                    f"algorithm.large_model.api_key_env={self.config.api_key_env!r} names an "
                    "environment variable that is not set",
                    fix=f"Set {self.config.api_key_env} in the provider's environment (a mounted "
                    "Secret on the cluster), or remove api_key_env for an endpoint without auth.",
                )
            headers["Authorization"] = f"Bearer {key}"
        data = json.dumps(body).encode()
        attempts = self.config.max_retries + 1
        client = RetryingClient(
            attempts=attempts,
            backoff_s=self._backoff_s,
            connect_timeout_s=self.config.timeout_s,
            read_timeout_s=self.config.timeout_s,
            retry_statuses=RETRYABLE_STATUS,
        )
        label = f"large model endpoint {self.config.url}"
        try:
            answer = client.send("POST", self.config.url, label=label, body=data, headers=headers)
        except MaxRetryError as err:
            self.requests += attempts
            last = str(err.reason or "no answer")
        else:
            self.requests += answer.requests
            if answer.status < 300:
                try:
                    reply: dict[str, Any] = json.loads(answer.body)
                except json.JSONDecodeError:
                    raise self._bad_reply("the response is not JSON") from None
                return reply
            text = answer.body.decode(errors="replace")[:MAX_ERROR_BODY]
            last = f"HTTP {answer.status}: {text}"
            if answer.status not in RETRYABLE_STATUS:
                raise ModelError(
                    f"the large model endpoint {self.config.url} refused the request ({last})",
                    fix="Check algorithm.large_model.url, .model and the API key; the endpoint "
                    "must support echo with logprobs on token-id prompts (legacy completions).",
                )
        raise ModelError(
            f"the large model endpoint {self.config.url} failed {attempts} "
            f"times; last error: {last}",
            fix="Check that the endpoint is up and reachable from the provider's step; raise "
            "algorithm.large_model.max_retries or timeout_s for a slow endpoint.",
        )

    # -- decoding the reply ------------------------------------------------------------------
    def _ids(self, entry: Any) -> dict[int, float]:
        if not isinstance(entry, dict):
            raise self._bad_reply(f"a top_logprobs entry is {type(entry).__name__}, not an object")
        mapped: dict[int, float] = {}
        for token, logprob in entry.items():
            token_id = self._token_id(token)
            if token_id is not None and 0 <= token_id < self.vocab_size:
                mapped[token_id] = float(logprob)
        return mapped

    def _token_id(self, token: str) -> int | None:
        if token.startswith("token_id:"):
            try:
                return int(token.removeprefix("token_id:"))
            except ValueError:
                return None
        if token in self._vocab:
            return self._vocab[token]
        ids = self._tokenizer(token, add_special_tokens=False)["input_ids"]
        return ids[0] if len(ids) == 1 else None

    def _dense(self, top: dict[int, float]) -> torch.Tensor:
        """Top-k log-probs exact; the rest share the missing mass evenly."""
        rest = self.vocab_size - len(top)
        missing = max(1.0 - sum(math.exp(v) for v in top.values()), 1e-12)
        row = torch.full((self.vocab_size,), math.log(missing / rest) if rest else -math.inf)
        if top:
            row[list(top)] = torch.tensor(list(top.values()))
        return row

    def _bad_reply(self, what: str) -> ModelError:
        return ModelError(
            f"the large model endpoint {self.config.url} answered without usable prompt "
            f"log-probabilities: {what}",
            fix="Use an endpoint that implements the legacy completions API with echo and "
            "logprobs (vLLM does; the OpenAI chat API does not return prompt log-probs).",
        )


def _count(value: Any) -> str:
    return str(len(value)) if isinstance(value, list) else type(value).__name__
