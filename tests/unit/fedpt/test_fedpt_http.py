"""The HTTP large model against a real completions endpoint serving a tiny model."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator

import pytest
import torch

from fedtune.algorithms.fedpt import proxy
from fedtune.algorithms.fedpt.config import LargeHttpConfig
from fedtune.algorithms.fedpt.http_source import HttpLogitSource
from fedtune.core.errors import ModelError
from fedtune.models.tiny import build_tiny_model
from fedtune.models.tokenizer import load_tokenizer
from tests.helpers.completions_server import CompletionsServer

TOKENIZER = load_tokenizer("builtin")
VOCAB = len(TOKENIZER)
API_KEY = "sk-fedtune-test-do-not-log"


def tiny(seed: int) -> torch.nn.Module:
    model = build_tiny_model(
        "llama",
        vocab_size=VOCAB,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        seed=seed,
        bos_token_id=TOKENIZER.bos_token_id,
        eos_token_id=TOKENIZER.eos_token_id,
        pad_token_id=TOKENIZER.pad_token_id,
    )
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(20.0)  # peaked, so top-k holds most mass
    return model.eval()


LARGE = tiny(1)


@pytest.fixture
def server() -> Iterator[CompletionsServer]:
    running = CompletionsServer(LARGE, TOKENIZER).start()
    yield running
    running.stop()


def source(server: CompletionsServer, **overrides: object) -> HttpLogitSource:
    fields = {"source": "http", "url": server.url, "model": "tiny-large", "tokenizer": "builtin"}
    config = LargeHttpConfig.model_validate(fields | overrides)
    return HttpLogitSource(config, TOKENIZER, backoff_s=0.01)


def batch(*texts: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and mask, like the provider's collate."""
    rows = [TOKENIZER(t)["input_ids"] for t in texts]
    width = max(map(len, rows))
    ids = torch.tensor([r + [TOKENIZER.pad_token_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return ids, mask


def reference_logprobs(ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(LARGE(input_ids=ids).logits.float(), dim=-1)


@pytest.mark.parametrize("token_ids", [True, False], ids=["token_id-keys", "token-string-keys"])
def test_full_top_k_reproduces_the_models_log_probs_over_a_padded_batch(
    server: CompletionsServer, token_ids: bool
) -> None:
    server.token_ids = token_ids
    ids, mask = batch("Give three tips for staying healthy.", "Name a colour.", "Hi")
    got = source(server, top_k=VOCAB, batch_size=2).logits(ids, mask)
    assert got.shape == (3, ids.shape[1], VOCAB)
    for row in range(3):
        n = int(mask[row].sum())
        expected = reference_logprobs(ids[row : row + 1, :n])[0]
        torch.testing.assert_close(got[row, :n], expected, atol=1e-4, rtol=0)
    assert len(server.requests) == 2  # batch_size=2 over 3 prompts


def test_top_k_entries_are_exact_and_the_rest_share_the_missing_mass(server: CompletionsServer) -> None:
    ids, mask = batch("Name a colour.")
    got = source(server, top_k=5).logits(ids, mask)[0]
    expected = reference_logprobs(ids)[0]
    for position in range(ids.shape[1]):
        top_values, top_ids = expected[position].topk(5)
        torch.testing.assert_close(got[position, top_ids], top_values, atol=1e-4, rtol=0)
        rest = torch.ones(VOCAB, dtype=torch.bool)
        rest[top_ids] = False
        missing = 1.0 - float(top_values.exp().sum())
        fill = got[position, rest]
        assert torch.allclose(fill, torch.full_like(fill, math.log(missing / (VOCAB - 5))), atol=1e-4)
        assert float(got[position].exp().sum()) == pytest.approx(1.0, abs=1e-4)


def test_proxy_generation_through_http_equals_the_local_model(server: CompletionsServer) -> None:
    """With the full distribution, HTTP decoding (recomputed prefix) equals KV-cached local decoding."""
    small_pre, small_ft = tiny(2), tiny(3)
    prompt = TOKENIZER("Give three tips")["input_ids"]
    local = proxy.generate(LARGE, small_pre, small_ft, prompt, 0.8, max_new_tokens=6)
    remote = proxy.generate(source(server, top_k=VOCAB), small_pre, small_ft, prompt, 0.8, max_new_tokens=6)
    assert remote == local


def test_busy_endpoint_is_retried_with_backoff(server: CompletionsServer) -> None:
    server.fail_next = [503, 429]
    http = source(server, max_retries=2)
    http.logits(*batch("Hi"))
    assert http.requests == 3


def test_endpoint_still_failing_after_retries_names_the_url_and_last_error(server: CompletionsServer) -> None:
    server.fail_next = [503, 503, 503]
    with pytest.raises(ModelError) as err:
        source(server, max_retries=2).logits(*batch("Hi"))
    assert server.url in str(err.value) and "failed 3 times" in str(err.value)
    assert "HTTP 503" in str(err.value) and "max_retries" in err.value.fix


def test_a_refused_request_fails_at_once_with_the_endpoints_message(server: CompletionsServer) -> None:
    with pytest.raises(ModelError, match="model gpt-9 not found") as err:
        source(server, model="gpt-9", max_retries=3).probe()
    assert len(server.requests) == 1  # 4xx is not retried
    assert "algorithm.large_model.url" in err.value.fix


def test_unreachable_endpoint_fails_after_retries() -> None:
    config = LargeHttpConfig(
        source="http", url="http://127.0.0.1:9/v1/completions", model="m", tokenizer="builtin", max_retries=1
    )
    http = HttpLogitSource(config, TOKENIZER, backoff_s=0.01)
    with pytest.raises(ModelError, match="127.0.0.1:9.*failed 2 times"):
        http.probe()


def test_api_key_comes_from_the_environment_and_is_never_logged(
    server: CompletionsServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    server.api_key = API_KEY
    server.fail_next = [503]
    monkeypatch.setenv("LARGE_MODEL_KEY", API_KEY)
    caplog.set_level(logging.DEBUG)
    source(server, api_key_env="LARGE_MODEL_KEY").probe()
    assert server.requests[-1][1]["Authorization"] == f"Bearer {API_KEY}"
    assert API_KEY not in caplog.text

    monkeypatch.delenv("LARGE_MODEL_KEY")
    with pytest.raises(ModelError, match="LARGE_MODEL_KEY.*not set"):
        source(server, api_key_env="LARGE_MODEL_KEY").probe()


def test_an_endpoint_without_prompt_log_probs_is_refused(server: CompletionsServer) -> None:
    server.complete = lambda body: {"choices": [{"index": 0, "text": "x", "logprobs": None}]}  # type: ignore[method-assign]
    with pytest.raises(ModelError, match="without usable prompt log-probabilities") as err:
        source(server).probe()
    assert "echo" in err.value.fix
