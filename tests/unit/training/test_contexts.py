"""The two contexts: what each party's phases can reach, and the job rules behind them."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from fedtune.config import parse_job
from fedtune.config.tenant_view import tenant_view
from fedtune.core.errors import ConfigError, ModelError
from fedtune.models.tokenizer import load_tokenizer
from fedtune.training.context import (
    ProviderContext,
    TenantContext,
    tokenizer_from_tensors,
    tokenizer_to_tensors,
)

SECRET_URI = "s3://provider-weights/secret-model"


def job_dict(**overrides: Any) -> dict[str, Any]:
    job: dict[str, Any] = {
        "name": "ctx",
        "model": {"source": "pretrained", "uri": SECRET_URI, "tenant_uri": "/mirror/model"},
        "algorithm": {"name": "fedavg"},
        "tenants": [{"name": "tenant-a", "data_uri": "a.jsonl"}],
        "public_data_uri": "s3://provider-public/public.jsonl",
        "tracking": {"backend": "none"},
    }
    job.update(overrides)
    return job


def _every_value(obj: Any) -> list[Any]:
    """Every field value reachable from a dataclass / pydantic object (not methods)."""
    seen: list[Any] = []
    stack = [obj]
    while stack:
        item = stack.pop()
        seen.append(item)
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            stack.extend(getattr(item, f.name) for f in dataclasses.fields(item))
        elif hasattr(item, "model_dump"):
            stack.extend(item.model_dump().values())
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return seen


def test_a_tenant_context_holds_no_path_to_the_providers_model() -> None:
    job = parse_job(job_dict())
    ctx = TenantContext.of_view(tenant_view(job, "tenant-a"))
    values = _every_value(ctx)
    assert not any(isinstance(v, str) and SECRET_URI in v for v in values)
    assert ctx.base.model == "/mirror/model"
    assert not hasattr(ctx, "public_examples") and not hasattr(ctx, "build_base")
    assert ctx.public_data_uri is None  # only fedmkt shares its public set with tenants


def test_a_fedbiot_tenant_context_has_no_model_at_all() -> None:
    job = parse_job(job_dict(model={"source": "pretrained", "uri": SECRET_URI}, algorithm={"name": "fedbiot"}))
    ctx = TenantContext.of_view(tenant_view(job, "tenant-a"))
    assert ctx.base.model is None
    with pytest.raises(ModelError, match="gives tenants no base model"):
        ctx.tokenizer()


def test_the_provider_context_reaches_the_model_and_the_public_data() -> None:
    job = parse_job(job_dict())
    ctx = ProviderContext.from_job(job)
    assert ctx.model_config.uri == SECRET_URI  # type: ignore[union-attr]
    assert ctx.public_data_uri == "s3://provider-public/public.jsonl"


def test_a_tenants_view_of_the_job_names_no_provider_uri() -> None:
    job = parse_job(
        job_dict(exchange_uri="s3://ex/runs", provider_store_uri="s3://provider-state/runs")
    )
    seen = tenant_view(job, "tenant-a").model_dump(mode="json")
    assert seen["base_model"] == "/mirror/model"
    assert "provider_store_uri" not in seen and seen["public_data_uri"] is None
    assert not any(u in str(seen) for u in (SECRET_URI, "provider-state", "provider-public"))


def test_a_fedmkt_tenant_pod_keeps_the_shared_public_set_and_nothing_else_of_the_provider() -> None:
    small = {"source": "tiny", "arch": "gpt2", "hidden_size": 16, "num_layers": 1, "num_heads": 2}
    job = parse_job(
        job_dict(
            model={"source": "tiny"},
            algorithm={"name": "fedmkt"},
            tenants=[{"name": "tenant-a", "data_uri": "a.jsonl", "model": small}],
            exchange_uri="s3://ex/runs",
            provider_store_uri="s3://provider-state/runs",
        )
    )
    seen = tenant_view(job, "tenant-a").model_dump(mode="json")
    assert seen["public_data_uri"] == "s3://provider-public/public.jsonl"
    assert seen["base_model"] is None and "provider-state" not in str(seen)


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        pytest.param(
            {"model": {"source": "pretrained", "uri": SECRET_URI}},
            "model.tenant_uri is not set",
            id="fedit-pretrained-without-tenant-copy",
        ),
        pytest.param(
            {"algorithm": {"name": "fedbiot"}},
            "must not give tenants the full model",
            id="fedbiot-with-tenant-copy",
        ),
        pytest.param(
            {"exchange_uri": "s3://ex/runs"},
            "provider_store_uri is not",
            id="exchange-without-provider-store",
        ),
    ],
)
def test_boundary_rules_of_the_job_are_config_errors(overrides: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        parse_job(job_dict(**overrides))


def test_a_tokenizer_travels_as_tensors_and_loads_identically() -> None:
    tokenizer = load_tokenizer("builtin")
    files = tokenizer_to_tensors(tokenizer)
    assert files and all(t.dtype == torch.uint8 for t in files.values())
    again = tokenizer_from_tensors(files)
    text = "Reverse the word: federated 123"
    assert again(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert again.pad_token_id == tokenizer.pad_token_id


@pytest.mark.parametrize("name", ["../escape.json", ".hidden"])
def test_a_package_tokenizer_file_with_a_path_is_refused(name: str) -> None:
    with pytest.raises(ModelError, match="not a plain file"):
        tokenizer_from_tensors({name: torch.zeros(3, dtype=torch.uint8)})


def test_a_fedmkt_tenant_context_has_its_own_model_and_the_shared_public_set() -> None:
    small = {"source": "tiny", "arch": "gpt2", "hidden_size": 16, "num_layers": 1, "num_heads": 2}
    job = parse_job(
        job_dict(
            model={"source": "pretrained", "uri": SECRET_URI},
            algorithm={"name": "fedmkt"},
            tenants=[{"name": "tenant-a", "data_uri": "a.jsonl", "model": small, "tokenizer": "builtin"}],
        )
    )
    ctx = TenantContext.of_view(tenant_view(job, "tenant-a"))
    assert not any(isinstance(v, str) and SECRET_URI in v for v in _every_value(ctx))
    assert ctx.base.model is not None and ctx.base.model.arch == "gpt2"
    assert ctx.base.tokenizer_spec == "builtin"
    assert ctx.public_data_uri == "s3://provider-public/public.jsonl"


def test_a_tenants_data_is_tokenized_once_per_tokenizer(caplog: pytest.LogCaptureFixture) -> None:
    from fedtune.data.formats import Example

    job = parse_job(job_dict(model={"source": "tiny"}, training={"max_seq_len": 96}))
    ctx = TenantContext.of_view(tenant_view(job, "tenant-a"))
    examples = [Example("hi", "", "yes"), Example("a prompt far too long " * 40, "", "no")]
    with caplog.at_level("WARNING", logger="fedtune.data.tokenize"):
        first, again = ctx.encode(examples), ctx.encode(examples)
    assert first == again and len(first) == 1
    # The skipped record is reported once, not once per round.
    assert sum("skipped 1 example" in r.message for r in caplog.records) == 1
    again.clear()  # callers get their own list
    assert ctx.encode(examples) == first
    # Another tokenizer (a broadcast package's) encodes afresh.
    ctx.adopt_tokenizer(tokenizer_to_tensors(load_tokenizer("builtin")))
    with caplog.at_level("WARNING", logger="fedtune.data.tokenize"):
        ctx.encode(examples)
    assert sum("skipped 1 example" in r.message for r in caplog.records) == 2
