"""Acceptance: a tenant receives its view of the job and nothing else, for every algorithm.

Generated from the registry: for every registered algorithm a valid job is built whose every
text field outside that tenant's view (every provider-only field, every other tenant's
entry, FedPT's large model on ``s3://`` and behind ``http``) holds a unique marker. No marker
may appear in the tenant's view, in the manifest of any pod the launcher starts for the
tenant, or in any object the provider puts in the tenant's exchange prefix (what a tenant
step can read).
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fedtune.algorithms.registry import algorithm_names
from fedtune.config import parse_job
from fedtune.config.algorithms import algorithm_sections
from fedtune.config.job import JobConfig
from fedtune.config.packages import smoke
from fedtune.config.tenant_view import tenant_view
from fedtune.core.errors import ConfigError
from fedtune.engines import layout, steps
from fedtune.engines.launcher_manifest import (
    TenantDeployment,
    build_job_manifest,
    build_urls_secret,
)
from fedtune.engines.tenant.pod_io import step_objects
from tests.helpers.algorithms import tenant_fields
from tests.integration.conftest import DATA, tiny_job_dict
from tests.integration.test_boundary import CLIENT_CASES

ME = "tenant-a"
OTHER_KEY = "ab" * 32  # another tenant's registered public key
TOLERATION = {"key": "pool", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
LARGE_S3 = {"source": "pretrained", "uri": "s3://provider-weights/large-model"}
LARGE_HTTP = {
    "source": "http",
    "url": "http://vllm.provider.svc:8000/v1/completions",
    "model": "provider-large-model",
    "tokenizer": "s3://provider-weights/large-tokenizer",
    "api_key_env": "PROVIDER_API_KEY",
}


def section_of(name: str) -> Any:
    return next(s for s in algorithm_sections() if name in s.model_fields["name"].annotation.__args__)


def full_job(workdir: Path, algorithm: dict[str, Any], *, runnable: bool) -> dict[str, Any]:
    """A job with every optional text field filled in: tracking, provider resources, another
    tenant's namespace, store, tracking, placement and key, FedMKT's tenant models."""
    section = section_of(algorithm["name"])
    loads_base = section.capabilities.tenants_load_base
    algorithm = dict(algorithm)
    secure = algorithm.pop("secure", False)
    raw = tiny_job_dict(workdir, algorithm=algorithm, rounds=1, min_clients=1)
    if secure:  # the view then names every party and its public key: nothing else of them
        raw["secure_aggregation"] = {"enabled": True}
    raw["tenants"] = raw["tenants"][:1] if smoke(algorithm["name"]).single_tenant else raw["tenants"][:2]
    if not loads_base and not section.capabilities.tenant_models:
        raw["model"]["num_layers"] = 6  # FedBiOT's family: adapter and emulator layers
    if not runnable:  # the provider's model as a directory: its URI must never reach a tenant
        raw["model"] = {"source": "pretrained", "uri": "s3://provider-weights/base"}
        if loads_base:
            raw["model"]["tenant_uri"] = "s3://public-mirror/base"
    raw.update(
        exchange_uri=str(workdir / "exchange"),
        provider_store_uri=str(workdir / "provider"),
        public_data_uri=str(DATA / "public.jsonl"),
        tracking={"backend": "mlflow", "tracking_uri": "http://mlflow.provider:5000",
                  "experiment": "provider-experiment", "registered_model": "provider-model"},
        provider={"image": "registry.provider/fedtune:1", "node_selector": {"pool": "provider"},
                  "tolerations": [TOLERATION]},
        # An audit where the algorithm has one (its settings then enter the view).
        audit={"enabled": section.capabilities.audit},
    )
    raw["tenants"][0]["store_uri"] = str(workdir / "mine")
    for tenant in raw["tenants"][1:]:
        tenant.update(
            namespace="other-namespace",
            store_uri="s3://other-tenant-bucket/state",
            identity_key=OTHER_KEY,
            resources={"node_selector": {"zone": "other"}, "tolerations": [TOLERATION]},
            tracking={"backend": "mlflow", "tracking_uri": "http://mlflow.other:5000",
                      "experiment": "other-experiment", "registered_model": "other-model"},
        )
    for tenant in raw["tenants"]:
        tenant.update(tenant_fields(algorithm["name"]))
    return raw


def kept(job: JobConfig, path: tuple[Any, ...], *, runnable: bool) -> bool:
    """Whether ``path`` of the job is in the tenant's view (or, for a run, must stay real)."""
    section = type(job.algorithm)
    head = path[0]
    if head in ("name", "seed", "rounds", "training", "lora", "limits"):
        return True
    if head == "tenants" and path[1] == 0:
        return True  # the tenant's own entry
    if head == "tenants" and job.secure_aggregation.enabled and path[2:] == ("name",):
        return True  # each tenant derives a secure round's roster from every party's name
    if head == "algorithm":
        return path[1] in section.tenant_fields or (runnable and path[1] == "large_model"
                                                    and path[2:] in (("url",), ("tokenizer",)))
    if head == "model":
        return section.capabilities.tenants_load_base and path[1:] == ("tenant_uri",) or runnable
    if head == "tokenizer":
        return section.capabilities.tenants_load_base or runnable
    if head == "public_data_uri":
        return section.capabilities.tenants_read_public or runnable
    if head in ("exchange_uri", "provider_store_uri") and runnable:
        return True  # the run's real stores
    # FedMKT's provider reads every tenant's tokenizer.
    return head == "tenants" and runnable and len(path) > 2 and path[2] in ("model", "tokenizer")


def text_paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], bool]]:
    """Every text leaf of a JSON value (False) and every key of a free-form map (True; a
    section's keys are its field names)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if path and path[-1] == "node_selector":
                yield (*path, key), True
            yield from text_paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from text_paths(item, (*path, i))
    elif isinstance(value, str):
        yield path, False


def _set(raw: dict[str, Any], path: tuple[Any, ...], is_key: bool, new: str) -> Callable[[], None]:
    parent: Any = raw
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if is_key:
        items = list(parent.items())
        parent.clear()
        parent.update((new if k == last else k, v) for k, v in items)
        return lambda: _set(raw, (*path[:-1], new), True, last) and None
    old = parent[last]
    parent[last] = new
    return lambda: parent.__setitem__(last, old)


def plant_markers(raw: dict[str, Any], *, runnable: bool) -> tuple[JobConfig, list[str], list[str]]:
    """Put a unique marker into every text field (and map key) outside the view that
    accepts one; returns the job, the markers, and the paths where no marker is valid."""
    job = parse_job(raw)
    markers: list[str] = []
    refused: list[str] = []
    full = job.model_dump(mode="json")  # every field, defaults included
    paths = list(text_paths(full))
    # Values first: renaming a map's key afterwards leaves no stale path behind.
    for path, is_key in [p for p in paths if not p[1]] + [p for p in paths if p[1]]:
        if kept(job, path, runnable=runnable):
            continue
        token = f"mkq{len(markers):03d}z"
        for candidate in (token, f"s3://{token}/x", f"http://{token}/v1", token.upper(), f"{token}.x"):
            undo = _set(full, path, is_key, candidate)
            try:
                job = parse_job(full)
            except ConfigError:
                undo()
                continue
            markers.append(token)
            break
        else:
            refused.append("/".join(map(str, path)))
    return job, markers, refused


def assert_no_marker(text: str, markers: list[str], where: str) -> None:
    found = sorted(set(re.findall(r"mkq\d{3}z", text.lower())) & set(markers))
    assert not found, f"{where} holds marker(s) {found} of fields outside the tenant's view"


# Fields whose value is a choice or a number pattern (no free text can go there).
CHOICES = re.compile(r"(source|arch|backend|data_format|optimizer|precision|device|name/?$|"
                     r"operator|effect|cpu|memory|alias|placement|zero_stage|adapter_training|"
                     r"adapter_placement|align_optimizer|delta_dtype|exact_match|too_few_records|"
                     r"aggregation_weights|server_optimizer|identity_key|neighbours|worker_devices|"
                     r"engine/name|workers)$")


def cases() -> Iterator[Any]:
    for name in algorithm_names():
        yield pytest.param(name, CLIENT_CASES[name], id=name)
        if section_of(name).capabilities.summed_update and not smoke(name).single_tenant:
            yield pytest.param(name, {**CLIENT_CASES[name], "secure": True}, id=f"{name}-secagg")
        if "large_model" in section_of(name).model_fields:  # a provider model of its own
            for where, large in (("s3", LARGE_S3), ("http", LARGE_HTTP)):
                yield pytest.param(name, {**CLIENT_CASES[name], "large_model": large}, id=f"{name}-{where}")


@pytest.mark.parametrize(("name", "algorithm"), list(cases()))
def test_nothing_outside_the_view_reaches_the_view_or_the_pod(
    name: str, algorithm: dict[str, Any], tmp_path: Path
) -> None:
    job, markers, refused = plant_markers(full_job(tmp_path, algorithm, runnable=False), runnable=False)
    assert len(markers) >= (12 if len(job.tenants) == 1 else 20)
    # Every field left unmarked takes a choice or a number, never text.
    assert all(CHOICES.search(path) for path in refused), [p for p in refused if not CHOICES.search(p)]
    if "large_model" in algorithm:
        assert "large_model" not in json.dumps(tenant_view(job, ME).model_dump(mode="json"))
    view = tenant_view(job, ME).model_dump(mode="json")
    assert_no_marker(json.dumps(view), markers, "the tenant's view")
    if job.secure_aggregation.enabled:
        assert view["secure_aggregation"]["identities"][job.tenants[1].name] == OTHER_KEY
    else:
        assert OTHER_KEY not in json.dumps(view)
    # The in-process view names this tenant's exchange prefix, under the exchange root only.
    local = layout.view_for(job, ME).model_dump(mode="json")
    prefix = local.pop("exchange_uri")
    assert prefix.endswith(f"/jobs/{job.name}/tenants/{ME}")
    assert_no_marker(json.dumps(local), markers, "the in-process tenant view")
    # Every pod the launcher starts for the tenant, built as the launcher builds it.
    deployment = TenantDeployment(namespace=ME, bucket_secret="tenant-a-bucket")
    kinds = ("client", "evaluate", "audit") if job.audit.enabled else ("client", "evaluate")
    for kind in kinds:
        round_index = 1 if kind == "client" else job.rounds
        gets, puts = step_objects(kind, tenant_view(job, ME), round_index)
        urls = {"get": {k: f"https://exchange.invalid/{k}" for k in gets},
                "put": {k: f"https://exchange.invalid/{k}" for k in puts}}
        manifest = build_job_manifest(job, ME, kind, round_index, deployment, run_key="run")
        assert_no_marker(json.dumps(manifest), markers, f"the {kind} pod's manifest")
        # The URLs reach the pod through the Job's own Secret, never the Job (or its pods).
        secret = build_urls_secret({**manifest, "metadata": {**manifest["metadata"], "uid": "u"}}, urls)
        payload = base64.b64decode(secret["data"]["presigned"]).decode()
        assert_no_marker(json.dumps(secret) + payload, markers, f"the {kind} pod's URL Secret")
        assert json.loads(payload) == urls
        assert not any(u in json.dumps(manifest) for g in urls.values() for u in g.values())


def exchange_files(job: JobConfig, tenant: str) -> dict[str, bytes]:
    store = layout.JobStores(job).exchange(tenant)
    return {key: store.get_bytes(key) for key in store.list("")}


@pytest.mark.parametrize(
    ("name", "algorithm"), [p for p in cases() if not p.id.endswith(("-s3", "-http", "-secagg"))]
)
def test_nothing_outside_the_view_reaches_the_tenants_exchange(
    name: str, algorithm: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every object a tenant step can read: the round's broadcast and the final one."""
    monkeypatch.chdir(tmp_path)
    job, markers, _ = plant_markers(full_job(tmp_path, algorithm, runnable=True), runnable=True)
    assert len(markers) >= (8 if len(job.tenants) == 1 else 15)
    provider = steps.ProviderEnv.create(job)
    steps.init_step(provider)
    steps.configure_step(provider, 1)
    # The final broadcast as tenants get it (from the initial state: the same fields).
    final = provider.algorithm.final_broadcast(provider.ctx, steps.ServerState.load(
        provider.store(), layout.state_key(0)))
    final.save(provider.store(), layout.final_broadcast_key(job.rounds))
    steps._publish(provider, layout.final_broadcast_key(job.rounds), [ME],
                   layout.final_tenant_broadcast_key(job.rounds))
    files = exchange_files(job, ME)
    assert any(k.endswith("broadcast.json") for k in files) and len(files) >= 4
    for key, data in files.items():
        assert_no_marker(data.decode("latin-1"), markers, f"exchange object {key}")


#: The algorithms whose provider queries a large model of its own (FedPT's family).
LARGE_MODEL_ALGORITHMS = [n for n in algorithm_names() if "large_model" in section_of(n).model_fields]


@pytest.mark.parametrize("name", LARGE_MODEL_ALGORITHMS)
def test_fedpts_large_model_behind_http_reaches_no_tenant_object(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real completions endpoint serves the large model: its model name, the variable that
    holds its API key, and the key itself are in nothing a tenant step can read."""
    from fedtune.models.tiny import build_tiny_model
    from fedtune.models.tokenizer import load_tokenizer
    from tests.helpers.completions_server import CompletionsServer

    monkeypatch.chdir(tmp_path)
    tokenizer = load_tokenizer("builtin")
    large = build_tiny_model(
        "llama", vocab_size=len(tokenizer), hidden_size=32, num_layers=2, num_heads=2,
        intermediate_size=64, max_position_embeddings=128, seed=1,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    ).eval()
    server = CompletionsServer(large, tokenizer).start()
    try:
        http = {**LARGE_HTTP, "url": server.url, "tokenizer": "builtin", "top_k": 50}
        algorithm = {**CLIENT_CASES[name], "large_model": http}
        job, markers, _ = plant_markers(full_job(tmp_path, algorithm, runnable=True), runnable=True)
        served = job.algorithm.large_model  # type: ignore[union-attr]
        key_env = served.api_key_env
        assert key_env and key_env.lower() in markers and served.model in markers
        server.model_name = served.model
        secret_key = uuid.uuid4().hex
        monkeypatch.setenv(key_env, secret_key)
        provider = steps.ProviderEnv.create(job)
        steps.init_step(provider)
        steps.configure_step(provider, 1)
        assert server.requests  # the provider did query the endpoint
        assert all(h.get("Authorization") == f"Bearer {secret_key}" for _, h in server.requests)
    finally:
        server.stop()
    files = exchange_files(job, ME)
    assert any(k.endswith("broadcast.json") for k in files)
    for key, data in files.items():
        text = data.decode("latin-1")
        assert_no_marker(text, markers, f"exchange object {key}")
        assert secret_key not in text and server.url not in text
