"""Whole FedMKT runs on the in-process engine: heterogeneous tenants (Llama and GPT-2 shapes,
three tokenizers), only knowledge crosses, bytes in the summary, and clear bad-input errors."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from safetensors import safe_open

from fedtune.config import parse_job
from fedtune.core.errors import ConfigError, DataError, FedtuneError, QuorumError
from fedtune.engines import layout
from fedtune.engines.local import RunOptions, run_job
from fedtune.tracking.base import NullTracker
from tests.helpers.tokenizers import metaspace_bpe, wordpiece
from tests.integration.conftest import DATA, tiny_job_dict

pytestmark = pytest.mark.slow

SMALL = {"source": "tiny", "hidden_size": 32, "num_layers": 1, "num_heads": 2,
         "intermediate_size": 64, "max_position_embeddings": 256}


def _texts() -> list[str]:
    rows = [json.loads(line) for line in (DATA / "all.jsonl").read_text().splitlines()]
    return [" ".join(str(v) for v in r.values()) for r in rows]


def fedmkt_job(tmp: Path, **algorithm: Any) -> dict[str, Any]:
    llama_tok, wp_tok = tmp / "tok-llama", tmp / "tok-wp"
    if not llama_tok.exists():
        metaspace_bpe(400, _texts()).save_pretrained(llama_tok)
        wordpiece(400, _texts()).save_pretrained(wp_tok)
    job = tiny_job_dict(tmp / "work", rounds=2, min_clients=3, public_data_uri=str(DATA / "public.jsonl"))
    job["algorithm"] = {"name": "fedmkt", "top_k": 8, "public_size": 6, "kd_batch_size": 3, **algorithm}
    models = [({**SMALL, "arch": "llama"}, str(llama_tok)), ({**SMALL, "arch": "gpt2"}, str(wp_tok)),
              ({**SMALL, "arch": "gpt2"}, "builtin")]
    for tenant, (model, tok) in zip(job["tenants"], models, strict=True):
        tenant.update(model=model, tokenizer=tok)
    job["training"]["max_seq_len"] = 200
    return job


def _tensor_digests(path: Path) -> set[str]:
    with safe_open(str(path), "pt") as f:
        return {hashlib.sha256(f.get_tensor(k).numpy().tobytes()).hexdigest() for k in f.keys()}


def _exchange_keys(job: Any) -> dict[Path, list[str]]:
    """Every tensor name in the exchange store, by file (and nothing but messages there)."""
    out = {}
    for path in sorted(p for p in (Path(job.workdir) / "exchange").rglob("*") if p.is_file()):
        if path.suffix == ".safetensors":
            with safe_open(str(path), "pt") as f:
                out[path] = list(f.keys())
        else:
            assert path.suffix in (".json", ".sha256"), path
    return out


def test_only_knowledge_crosses_and_bytes_are_summarised(tmp_path):
    data = fedmkt_job(tmp_path, llm_eval_size=20)
    data["tenants"][0]["tracking"] = {"tracking_uri": f"sqlite:///{tmp_path / 'tenant-a-mlflow.db'}"}
    job = parse_job(data)
    summary = run_job(job, NullTracker(), RunOptions(progress=False))
    exchange = Path(job.workdir) / "exchange"
    files = _exchange_keys(job)
    assert files
    for path, keys in files.items():
        bad = [k for k in keys if not k.startswith(("knowledge/", "tokenizer/"))]
        assert not bad, (path, bad)  # no adapter (not even slm_adapter/*), no weights
        if "update" in path.name:
            assert keys and all(k.startswith("knowledge/") for k in keys)
    provider = Path(job.workdir) / "provider" / "jobs" / job.name
    summaries = [json.loads(p.read_text()) for p in sorted((provider / "summary").glob("round-*.json"))]
    assert len(summaries) == 2
    for record in summaries:
        for name, tenant in record["tenants"].items():
            update = exchange / "jobs" / job.name / layout.tenant_prefix(name) / f"{layout.update_key(record['round'])}.safetensors"
            assert tenant["bytes_received"] >= update.stat().st_size > 0
            assert tenant["bytes_sent"] > 0 and "public_ce" in tenant["metrics"]
    text = json.dumps(summaries[-1])
    assert "eval/llm/public_ce" in text and "fedmkt/llm_selected" in text
    # every model is scored every round, under its own name
    for record in summaries:
        assert {"eval/llm/acc", "eval/llm/rouge_l"} <= set(record["server_metrics"])
        for tenant in record["tenants"].values():
            assert {"eval/slm/acc", "eval/slm/rouge_l"} & set(tenant["metrics"])
    assert all("slm/acc" in m or "slm/rouge_l" in m for m in summary["final_eval"].values())
    # the small models stay in their tenants' stores: client state and the final export
    tenants = Path(job.workdir) / "tenants"
    exported: set[str] = set()
    for name in ("tenant-a", "tenant-b", "tenant-c"):
        own = tenants / name / "jobs" / job.name
        assert any((own / "client-state").iterdir())
        slm = own / "artifacts" / "slm"
        assert (slm / "config.json").exists() and (slm / "adapter" / "adapter_config.json").exists()
        exported |= _tensor_digests(next((slm / "adapter").glob("*.safetensors")))
    # ... and never reach the provider's store or the exchange, under any name
    provider_root = Path(job.workdir) / "provider"
    for path in sorted(p for root in (provider_root, exchange) for p in root.rglob("*") if p.is_file()):
        assert "slm" not in path.relative_to(Path(job.workdir)).as_posix(), path
        if path.suffix == ".safetensors":
            assert not _tensor_digests(path) & exported, path
    # a tenant with its own tracking registers its small model there; the others do not
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'tenant-a-mlflow.db'}")
    assert [m.name for m in client.search_registered_models()] == ["itest-tenant-a-slm"]
    assert summary


def test_public_set_hash_mismatch_is_refused(tmp_path):
    from fedtune.algorithms.fedmkt.public import check_same_public
    from fedtune.data.formats import Example

    a = [Example("i", "", "r")]
    with pytest.raises(DataError, match=r"tenant 'x': the public set at 'p.jsonl' \(1 examples\) has content hash"):
        check_same_public("0" * 64, a, "p.jsonl", "tenant 'x'")


def _altered_public_for(tenant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``tenant``'s copy of the public set has one response changed (the others' do not)."""
    from fedtune.training.context import TenantContext

    original = TenantContext.shared_public_examples

    def altered(self: TenantContext) -> list[Any]:
        examples = original(self)
        if self.tenant == tenant:
            examples[0] = dataclasses.replace(examples[0], response=examples[0].response + " (edited)")
        return examples

    monkeypatch.setattr(TenantContext, "shared_public_examples", altered)


def test_a_tenant_whose_public_set_differs_refuses_the_broadcast_and_is_rejected(tmp_path, monkeypatch):
    from fedtune.algorithms.fedmkt.public import public_hash
    from fedtune.training.context import read_public

    _altered_public_for("tenant-b", monkeypatch)
    data = fedmkt_job(tmp_path)
    data["rounds"], data["min_clients"] = 1, 2
    job = parse_job(data)
    summary = run_job(job, NullTracker(), RunOptions(progress=False))
    record = summary["rounds"][0]
    assert record["accepted"] == ["tenant-a", "tenant-c"]
    # The provider learns the kind (fixed text), never the tenant's values ...
    assert "PublicSetMismatch" in record["rejected"]["tenant-b"]
    assert "copy of the public set differs from the provider's" in record["rejected"]["tenant-b"]
    # ... the tenant reads the full error in its own store: both content hashes.
    details = next((Path(job.workdir) / "tenants" / "tenant-b").rglob("errors/*.txt")).read_text()
    public = read_public(job.public_data_uri)[: job.algorithm.public_size]
    theirs = [dataclasses.replace(public[0], response=public[0].response + " (edited)"), *public[1:]]
    assert f"sha256:{public_hash(public)}" in details and f"sha256:{public_hash(theirs)}" in details
    assert "refuses the broadcast" in details and "fix: Give every party the same public_data_uri" in details


def test_a_public_set_mismatch_below_quorum_stops_the_round(tmp_path, monkeypatch):
    _altered_public_for("tenant-b", monkeypatch)
    data = fedmkt_job(tmp_path)
    data["rounds"] = 1  # min_clients 3: every tenant is needed
    job = parse_job(data)
    with pytest.raises(QuorumError, match=r"(?s)2 valid update\(s\) of 3 sampled.*tenant-b: .*PublicSetMismatch"):
        run_job(job, NullTracker(), RunOptions(progress=False))


def test_token_ids_beyond_a_tenants_vocabulary_reject_that_tenant_only(tmp_path, monkeypatch):
    from fedtune.algorithms.fedmkt.algorithm import FedMKT

    original = FedMKT.client_step

    def oversized_ids(self, ctx, broadcast, data, client_state):  # type: ignore[no-untyped-def]
        update, state = original(self, ctx, broadcast, data, client_state)
        if ctx.tenant == "tenant-a":
            ids = update.tensors["knowledge/topk_ids"].clone()
            ids[0, 0] = len(ctx.tokenizer()) + 7  # a valid id for the LLM, not for tenant-a
            update.tensors["knowledge/topk_ids"] = ids
        return update, state

    monkeypatch.setattr(FedMKT, "client_step", oversized_ids)
    data = fedmkt_job(tmp_path)
    data["rounds"], data["min_clients"] = 2, 2
    job = parse_job(data)
    summary = run_job(job, NullTracker(), RunOptions(progress=False))
    from fedtune.models.tokenizer import load_tokenizer

    vocab = len(load_tokenizer(str(tmp_path / "tok-llama")))
    for record in summary["rounds"]:  # both rounds go on with the two others
        assert record["accepted"] == ["tenant-b", "tenant-c"]
        reason = record["rejected"]["tenant-a"]
        assert f"token id {vocab + 7} is beyond the tenant's vocabulary of {vocab} tokens" in reason


def test_unloadable_tenant_tokenizer_is_refused(tmp_path):
    data = fedmkt_job(tmp_path)
    data["tenants"][1]["tokenizer"] = str(tmp_path / "missing-tokenizer")
    job = parse_job(data)
    with pytest.raises(FedtuneError, match=r"tenant 'tenant-b': its tokenizer .*missing-tokenizer.* cannot be loaded"):
        run_job(job, NullTracker(), RunOptions(progress=False))


def test_top_k_larger_than_a_vocabulary_is_refused(tmp_path):
    job = parse_job(fedmkt_job(tmp_path, top_k=5000))
    with pytest.raises(ConfigError, match=r"top_k=5000 is larger than the vocabulary of"):
        run_job(job, NullTracker(), RunOptions(progress=False))


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_ce_weight_outside_unit_interval_is_refused(tmp_path, value):
    with pytest.raises(Exception, match=rf"ce_weight={value} is outside \[0, 1\]"):
        parse_job(fedmkt_job(tmp_path, ce_weight=value))


def test_llm_eval_size_holding_out_every_public_row_is_refused(tmp_path):
    job = parse_job(fedmkt_job(tmp_path, llm_eval_size=100))
    with pytest.raises(ConfigError, match=r"llm_eval_size=100 holds out all 100 public examples"):
        run_job(job, NullTracker(), RunOptions(progress=False))


def test_tenant_tracking_without_its_own_uri_is_refused(tmp_path):
    data = fedmkt_job(tmp_path)
    data["tenants"][0]["tracking"] = {"experiment": "mine"}
    with pytest.raises(Exception, match=r"tenants\[tenant-a\].tracking has no tracking_uri"):
        parse_job(data)


def test_tenant_without_model_is_refused(tmp_path):
    data = fedmkt_job(tmp_path)
    del data["tenants"][0]["model"]
    with pytest.raises(Exception, match="tenant 'tenant-a' has no model"):
        parse_job(data)


def homogeneous_job(tmp: Path) -> dict[str, Any]:
    """Three tenants declaring the same small model and tokenizer, ``fedavg_small: true``."""
    data = fedmkt_job(tmp, fedavg_small=True)
    for tenant in data["tenants"]:
        tenant.update(model={**SMALL, "arch": "llama"}, tokenizer="builtin")
    return data


def test_homogeneous_mode_averages_the_small_models_adapters(tmp_path):
    import torch

    from fedtune.core.messages import Broadcast, ServerState, Update
    from fedtune.engines import steps

    job = parse_job(homogeneous_job(tmp_path))
    run_job(job, NullTracker(), RunOptions(progress=False))
    for path, keys in _exchange_keys(job).items():
        bad = [k for k in keys if not k.startswith(("knowledge/", "tokenizer/", "slm_adapter/"))]
        assert not bad, (path, bad)  # adapters cross in this mode, never base weights
    stores = layout.JobStores(job)
    names = sorted(t.name for t in job.tenants)
    uploads = [Update.load(stores.exchange(n), layout.update_key(1)) for n in names]
    assert all(u.group("slm_adapter") for u in uploads)
    weights = [float(u.meta["num_samples"]) for u in uploads]
    state = ServerState.load(steps.ProviderEnv.create(job).store(), layout.state_key(1))
    average = state.group("slm_adapter")
    assert set(average) == set(uploads[0].group("slm_adapter"))
    for key, value in average.items():
        expected = sum(w * u.group("slm_adapter")[key].double() for w, u in zip(weights, uploads, strict=True)) / sum(weights)
        torch.testing.assert_close(value.double(), expected, rtol=1e-6, atol=1e-7)
    # ... and broadcast to every tenant for round 2 (its client step starts from it)
    for name in names:
        sent = Broadcast.load(stores.exchange(name), layout.round_broadcast_key(2)).group("slm_adapter")
        assert all(torch.equal(sent[k], average[k]) for k in average)


def test_heterogeneous_job_refuses_fedavg_small(tmp_path):
    with pytest.raises(Exception, match=r"fedavg_small: true averages .* tenant 'tenant-b' has model .*gpt2.* give every tenant the same"):
        parse_job(fedmkt_job(tmp_path, fedavg_small=True))


@pytest.fixture
def s3_bucket(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A bucket on moto's S3 server, with boto3 pointed at it."""
    from tests.helpers.moto import create_bucket, start_moto_server, use_fake_aws_env

    server = start_moto_server()
    try:
        use_fake_aws_env(monkeypatch, server.endpoint_url)
        yield create_bucket(server.endpoint_url)
    finally:
        server.stop()


def _upload(store: Any, prefix: str, folder: Path, names: Any = None) -> None:
    for path in sorted(p for p in folder.iterdir() if p.is_file() and (names is None or p.name in names)):
        store.put_bytes(f"{prefix}/{path.name}", path.read_bytes())


def test_a_tenants_own_model_and_tokenizer_load_from_its_own_s3_store(tmp_path, s3_bucket):
    from fedtune.models.loading import save_pretrained_dir
    from fedtune.models.tiny import build_tiny_model
    from fedtune.models.tokenizer import load_tokenizer
    from fedtune.storage import open_store

    data = fedmkt_job(tmp_path)
    # tenant-a's small model, pretrained elsewhere, and its tokenizer, in its own store only.
    tokenizer = load_tokenizer(str(tmp_path / "tok-llama"))
    small = {k: v for k, v in SMALL.items() if k != "source"}
    model = build_tiny_model("llama", vocab_size=len(tokenizer), seed=3, bos_token_id=tokenizer.bos_token_id,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **small)
    save_pretrained_dir(model, tokenizer, tmp_path / "slm")
    root = f"s3://{s3_bucket}/tenant-a"
    own = open_store(root)
    _upload(own, "models/slm", tmp_path / "slm")
    _upload(own, "tokenizers/sp", tmp_path / "tok-llama")
    data["tenants"][0].update(
        store_uri=root, model={"source": "pretrained", "uri": f"{root}/models/slm"},
        tokenizer=f"{root}/tokenizers/sp",
    )
    data["rounds"] = 1
    job = parse_job(data)
    summary = run_job(job, NullTracker(), RunOptions(progress=False))
    assert summary["rounds"][0]["accepted"] == ["tenant-a", "tenant-b", "tenant-c"]
    # Its client state and its final small model went back into its own store, nowhere else.
    kept = own.list(f"jobs/{job.name}/")
    assert any(k.startswith(f"jobs/{job.name}/client-state/") for k in kept)
    assert f"jobs/{job.name}/artifacts/slm/adapter/adapter_config.json" in kept
    assert not (Path(job.workdir) / "tenants" / "tenant-a").exists()


def test_a_tenant_reads_its_own_model_only_inside_its_own_store(tmp_path, s3_bucket):
    from fedtune.training.context import TenantContext, own_store_part

    data = fedmkt_job(tmp_path)
    # tenant-b points at tenant-a's model: refused before anything is read.
    data["tenants"][1].update(
        store_uri=f"s3://{s3_bucket}/tenant-b",
        model={"source": "pretrained", "uri": f"s3://{s3_bucket}/tenant-a/models/slm"},
    )
    job = parse_job(data)
    from fedtune.config.tenant_view import tenant_view

    ctx = TenantContext.of_view(tenant_view(job, "tenant-b"))
    with pytest.raises(ConfigError, match=r"tenant 'tenant-b': its own model 's3://.*/tenant-a/models/slm' is not inside its store 's3://.*/tenant-b'"):
        ctx.tokenizer()
    store = f"s3://{s3_bucket}/tenant-a"
    with pytest.raises(ConfigError, match="is not inside its store"):  # a bucket-prefix look-alike
        own_store_part(f"s3://{s3_bucket}/tenant-ab/models/slm", store, "tenant-a", "model")
    with pytest.raises(ConfigError, match="is not inside its store"):  # no store of its own
        own_store_part(f"{store}/models/slm", None, "tenant-a", "model")
    with pytest.raises(FedtuneError, match=r"\.\."):  # climbing out of the prefix
        own_store_part(f"{store}/../tenant-b/models/slm", store, "tenant-a", "model")
    assert own_store_part(str(tmp_path / "slm"), store, "tenant-a", "model") is None  # local disk


def test_the_example_runs_end_to_end_and_logs_every_model_per_round(tmp_path):
    """examples/fedmkt.yaml as shipped (three tokenizers, Llama and GPT-2 tenants), shortened
    to two rounds of two steps, with the memorization audit: MLflow holds the LLM's and each
    tenant's SLM's scores, under the model's name, for every round; every tenant audits its own
    small model, and the LLM's registered version carries no score of another model."""
    import mlflow

    from fedtune.config import load_job
    from fedtune.tracking.factory import make_tracker

    example = load_job(Path(__file__).resolve().parents[2] / "examples" / "fedmkt.yaml")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    job = example.model_copy(update={
        "workdir": str(tmp_path / "work"), "rounds": 2,
        "training": example.training.model_copy(update={"local_steps": 2}),
        "tracking": example.tracking.model_copy(update={"tracking_uri": uri}),
        "audit": example.audit.model_copy(update={"enabled": True, "records": 4}),
    })
    summary = run_job(job, make_tracker(job), RunOptions(progress=False))
    assert [r["accepted"] for r in summary["rounds"]] == [["tenant-a", "tenant-b", "tenant-c"]] * 2
    client = mlflow.MlflowClient(tracking_uri=uri)
    [run] = client.search_runs([client.get_experiment_by_name(job.tracking.experiment).experiment_id])
    keys = set(run.data.metrics)

    def rounds_of(key: str) -> set[int]:
        return {m.step for m in client.get_metric_history(run.info.run_id, key)}

    for key in ("server/eval/llm/acc", "server/eval/llm/rouge_l"):  # the LLM, every round
        assert key in keys and rounds_of(key) == {1, 2}, sorted(keys)
    for tenant in ("tenant-a", "tenant-b", "tenant-c"):  # each tenant's SLM, every round
        named = [k for k in keys if k.endswith((f"eval/slm/acc/{tenant}", f"eval/slm/rouge_l/{tenant}"))]
        assert named and all(rounds_of(k) == {1, 2} for k in named), sorted(keys)
    assert [m.name for m in client.search_registered_models()] == [job.name]
    audit = summary["audit"]
    assert sorted(audit["tenants"]) == ["tenant-a", "tenant-b", "tenant-c"] and audit["tagged"] == []
    assert "own model" in audit["subject"] and "audit/memorization/mean" in keys
    [version] = client.search_model_versions(f"name='{job.name}'")
    assert not [t for t in version.tags if t.startswith("fedtune.audit")]


def test_every_round_ends_with_its_llm_to_slm_transfer_the_last_one_included(tmp_path):
    """Algorithm 1 ends each round with the LLM -> SLM transfer: after R rounds a tenant's
    final small model has had R of them (round 1's included), and what it scores, exports and
    audits is the model after the last one, not the one its last client step trained."""
    import torch
    from safetensors.torch import load

    from fedtune.core.messages import ClientState
    from fedtune.engines import steps

    job = parse_job(fedmkt_job(tmp_path))
    summary = run_job(job, NullTracker(), RunOptions(progress=False))
    for tenant in job.tenants:
        own = steps.TenantEnv.create(job, tenant.name).own
        trained = ClientState.load(own, layout.client_state_key(job.rounds))
        final = ClientState.load(own, layout.final_client_state_key(job.rounds))
        assert final.meta["transfers"] == list(range(1, job.rounds + 1))
        assert trained.meta["transfers"] == list(range(1, job.rounds))
        changed = [k for k, v in final.group("adapter").items() if not torch.equal(v, trained.group("adapter")[k])]
        assert changed, f"{tenant.name}: the last round's transfer left the small model as trained"
        exported = load(own.get_bytes("artifacts/slm/adapter/adapter_model.safetensors"))
        digests = {hashlib.sha256(t.numpy().tobytes()).hexdigest() for t in final.group("adapter").values()}
        assert {hashlib.sha256(t.numpy().tobytes()).hexdigest() for t in exported.values()} == digests
        assert summary["final_eval"][tenant.name] == {k.removeprefix("eval/"): v for k, v in final.meta["metrics"].items()}
