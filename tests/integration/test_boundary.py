"""The provider/tenant boundary, tested the way an auditor would.

1. Every algorithm's client step runs in a separate process whose environment holds no
   credentials for the provider's model, which lives in an S3 prefix: the step must succeed
   without reading it (FedIT from ``model.tenant_uri``, FedBiOT from the broadcast alone).
2. For whole FedAvg, SCAFFOLD, FedBiOT, FedPT, FedMKT and FewFedPIT runs, every file written
   is assigned the parties that can read it (by store scope); the test fails on any
   cross-tenant or provider-to-tenant leak, by key and by tensor content (FedPT's large
   model, FedMKT's kept small models, FewFedPIT's private parameters included).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from fedtune.config import JobConfig, parse_job
from fedtune.config.capabilities import capabilities_of
from fedtune.config.packages import smoke
from fedtune.engines import layout, steps
from fedtune.engines.local import RunOptions, run_job
from fedtune.models.layers import unique_state
from fedtune.storage import open_store
from fedtune.tracking.base import NullTracker
from fedtune.training.context import ProviderContext
from tests.helpers.algorithms import SMOKE, tenant_fields
from tests.helpers.moto import create_bucket, use_fake_aws_env
from tests.integration.conftest import DATA, tiny_job_dict
from tests.integration.test_fedbiot import provider_model_dir
from tests.kfp.test_tenant_pod import moto_endpoint  # noqa: F401 - a module-scoped fixture

QUIET = RunOptions(progress=False)

#: Every registered algorithm, with the settings that make its client step quick (declared in
#: its package).
CLIENT_CASES: dict[str, dict[str, Any]] = SMOKE


def _upload_dir(bucket: str, prefix: str, folder: Path) -> str:
    """Upload a model directory as the provider would (fedtune's store, with checksums)."""
    uri = f"s3://{bucket}/{prefix}"
    store = open_store(uri)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        store.put_bytes(path.relative_to(folder).as_posix(), path.read_bytes())
    return uri


def _no_credentials_env(endpoint: str) -> dict[str, str]:
    """The tenant process: no AWS credentials at all (the provider's prefix is unreadable)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_CONFIG_FILE="/nonexistent/aws-config",
        AWS_SHARED_CREDENTIALS_FILE="/nonexistent/aws-credentials",
        AWS_EC2_METADATA_DISABLED="true",
        FEDTUNE_S3_ENDPOINT_URL=endpoint,  # any attempt to read the model would go here and fail
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(
            [str(Path(__file__).resolve().parents[2] / "src"), os.environ.get("PYTHONPATH", "")]
        ),
    )
    return env


_TENANT_DRIVER = """
import json, sys
from fedtune.config.tenant_view import TenantJob
from fedtune.core.update_meta import check_update_meta
from fedtune.engines import steps
done = {}
for raw in json.loads(sys.stdin.read()):
    view = TenantJob.model_validate(raw)  # the tenant process gets its view, never the job
    result = steps.client_step(steps.TenantEnv.create(view), 1)
    check_update_meta(view.name, result["meta"])  # what it reports fits the provider's schema
    done[view.algorithm.name] = result["meta"]["num_samples"]
print(json.dumps(done))
"""


@pytest.mark.slow
def test_every_client_step_runs_where_the_providers_model_is_unreadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str
) -> None:
    use_fake_aws_env(monkeypatch, moto_endpoint)
    bucket = create_bucket(moto_endpoint)
    local_model = provider_model_dir(tmp_path / "model", num_layers=6)
    model_uri = _upload_dir(bucket, "provider/model", local_model)
    # FedIT tenants read a copy the provider makes available to them (a public mirror).
    public_copy = provider_model_dir(tmp_path / "public-mirror", num_layers=6)
    jobs = []
    for name, algorithm in CLIENT_CASES.items():
        model: dict[str, Any] = {"source": "pretrained", "uri": model_uri}
        if capabilities_of(name).tenants_load_base:
            model["tenant_uri"] = str(public_copy)
        tenants = 1 if smoke(name).single_tenant else 3
        raw = tiny_job_dict(
            tmp_path / name,
            name=f"b-{name}",
            model=model,
            algorithm=algorithm,
            rounds=1,
            min_clients=1,
            public_data_uri=str(DATA / "public.jsonl"),
        )
        raw["tenants"] = raw["tenants"][:tenants]
        for tenant in raw["tenants"]:
            tenant.update(tenant_fields(name))
        job = parse_job(raw)
        provider = steps.ProviderEnv.create(job)
        steps.init_step(provider)
        steps.configure_step(provider, 1)
        jobs.append(layout.view_for(job, job.tenants[0].name).model_dump(mode="json"))
    done = subprocess.run(
        [sys.executable, "-c", _TENANT_DRIVER],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        env=_no_credentials_env(moto_endpoint),
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(counts) == set(CLIENT_CASES) and all(n > 0 for n in counts.values())
    # The same process without the broadcast's package has no way to the model: reading the
    # provider's URI from a tenant process fails for lack of credentials.
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from fedtune.models.loading import load_pretrained; load_pretrained({model_uri!r})",
        ],
        capture_output=True,
        text=True,
        env=_no_credentials_env(moto_endpoint),
        timeout=300,
    )
    assert probe.returncode != 0 and "credentials" in probe.stderr.lower()


# -- the readability table ------------------------------------------------------------------


def _digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def readers(path: Path, workdir: Path, tenants: list[str]) -> frozenset[str]:
    """Which parties can read a file the run wrote, by the store scope it lies in."""
    rel = path.relative_to(workdir).parts
    if rel[0] in ("provider", "artifacts", "runs") or rel[0].startswith("mlflow"):
        return frozenset({"provider"})
    if rel[0] == "exchange":
        # exchange/jobs/<job>/tenants/<name>/...
        assert rel[1] == "jobs" and rel[3] == "tenants", f"unscoped exchange object {path}"
        assert rel[4] in tenants, f"exchange object outside any tenant's prefix: {path}"
        return frozenset({"provider", rel[4]})
    if rel[0] == "tenants":
        assert rel[1] in tenants
        return frozenset({rel[1]})
    raise AssertionError(f"a file outside every known scope: {path}")


def readability_table(workdir: Path, tenants: list[str]) -> dict[Path, frozenset[str]]:
    return {p: readers(p, workdir, tenants) for p in sorted(workdir.rglob("*")) if p.is_file()}


def _tensors_readable_by(table: dict[Path, frozenset[str]], party: str) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path, who in table.items():
        if party in who and path.name.endswith(".safetensors"):
            for tensor in load_file(path).values():
                found.setdefault(_digest(tensor), path)
    return found


def _run(make: Any, **fields: Any) -> JobConfig:
    job = make(**fields)
    run_job(job, NullTracker(), QUIET)
    return job


@pytest.fixture
def make(tmp_path: Path) -> Any:
    counter = iter(range(100))

    def build(**fields: Any) -> JobConfig:
        return parse_job(tiny_job_dict(build.workdir(), **fields))

    build.workdir = lambda: tmp_path / f"w{next(counter)}"  # type: ignore[attr-defined]
    return build


def _check_key_scopes(job: JobConfig, table: dict[Path, frozenset[str]]) -> None:
    tenants = [t.name for t in job.tenants]
    for path, who in table.items():
        text = path.as_posix()
        tenant_readable = who - {"provider"}
        if tenant_readable:
            # Server states, summaries, run records and exports are provider-private; a
            # tenant's own store may hold its own exports (FedMKT's small model).
            own_store = "provider" not in who
            for forbidden in ("/state/", "/summary/", "run.json", *(() if own_store else ("/artifacts/",))):
                assert forbidden not in text, f"{path} is readable by {sorted(tenant_readable)}"
        for party in tenant_readable:
            others = [t for t in tenants if t != party]
            assert not any(f"/{o}/" in text for o in others), f"{party} can read {path}"


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold"])
def test_fedit_runs_leak_nothing_across_the_boundary(make: Any, algorithm: str) -> None:
    job = _run(make, algorithm=CLIENT_CASES[algorithm], rounds=2)
    workdir = Path(job.workdir)
    tenants = [t.name for t in job.tenants]
    table = readability_table(workdir, tenants)
    _check_key_scopes(job, table)
    stores = layout.JobStores(job)
    provider = stores.provider()
    # Each tenant's update reaches the provider, never another tenant.
    sent = _digests_of_broadcasts(stores)
    for tenant in tenants:
        update = stores.exchange(tenant).get_tensors(f"{layout.update_key(1)}.safetensors")
        own = {_digest(t) for t in update.values() if t.abs().sum() > 0} - sent
        assert own
        for other in (t for t in tenants if t != tenant):
            readable = _tensors_readable_by(table, other)
            leaked = own & set(readable)
            assert not leaked, f"{other} can read {tenant}'s update in {readable[leaked.pop()]}"
    # SCAFFOLD's client control variate stays with its tenant.
    if algorithm == "scaffold":
        for tenant_config in job.tenants:
            own = stores.tenant(tenant_config)
            newest = sorted(k for k in own.list("client-state/") if k.endswith(".safetensors"))[-1]
            kept = own.get_tensors(newest)
            control = {_digest(t) for n, t in kept.items() if n.startswith("control/") and t.abs().sum() > 0}
            assert control
            for party in ["provider", *[t for t in tenants if t != tenant_config.name]]:
                assert not control & set(_tensors_readable_by(table, party)), party
    # The final evaluation handed tenants the adapter only (no server control variate).
    for tenant in tenants:
        final = stores.exchange(tenant).get_tensors(
            f"{layout.final_tenant_broadcast_key(job.rounds)}.safetensors"
        )
        assert final and all(name.startswith("adapter/") for name in final)
    assert provider.exists(f"{layout.state_key(job.rounds)}.json")


def _digests_of_broadcasts(stores: layout.JobStores) -> set[str]:
    """Tensors the provider sent everyone (an update may legitimately equal one of them)."""
    provider = stores.provider()
    return {
        _digest(t)
        for key in provider.list("broadcast/")
        if key.endswith(".safetensors")
        for t in provider.get_tensors(key).values()
    }


@pytest.mark.slow
def test_fedbiot_run_leaks_neither_the_full_model_nor_state_to_tenants(
    make: Any, tmp_path: Path
) -> None:
    model_dir = provider_model_dir(tmp_path / "provider-model")
    job = _run(
        make,
        model={"source": "pretrained", "uri": str(model_dir)},
        algorithm=CLIENT_CASES["fedbiot"],
        public_data_uri=str(DATA / "public.jsonl"),
        rounds=2,
    )
    workdir = Path(job.workdir)
    tenants = [t.name for t in job.tenants]
    table = readability_table(workdir, tenants)
    _check_key_scopes(job, table)
    # The layers FedBiOT keeps home (dropped from the emulator) are readable by no tenant.
    summary = steps.final_state(steps.ProviderEnv.create(job)).meta["run_info"]
    dropped = {f"model.layers.{i}." for i in summary["dropped_layers"]}
    base = unique_state(ProviderContext.from_job(job).base_model())
    secret = {_digest(t): n for n, t in base.items() if any(n.startswith(p) for p in dropped)}
    assert secret
    for tenant in tenants:
        readable = _tensors_readable_by(table, tenant)
        assert not set(secret) & set(readable), f"{tenant} can read a dropped layer"
        # Tenants got the tokenizer in the package (never from the provider's model).
        final = layout.JobStores(job).exchange(tenant).get_tensors(
            f"{layout.final_tenant_broadcast_key(job.rounds)}.safetensors"
        )
        assert any(n.startswith("tokenizer/") for n in final)
        assert not any(n.startswith(("view/", "emulator/")) for n in final)


def _variant_job(make: Any, name: str) -> JobConfig:
    """A two-round job of ``name`` as the CLIENT_CASES run it (public set, tenant models)."""
    raw = tiny_job_dict(make.workdir(), algorithm=CLIENT_CASES[name], rounds=2,
                        public_data_uri=str(DATA / "public.jsonl"))
    for tenant in raw["tenants"]:
        tenant.update(tenant_fields(name))
    job = parse_job(raw)
    run_job(job, NullTracker(), QUIET)
    return job


def _kept_secret(job: JobConfig, prefix: str) -> dict[str, set[str]]:
    """Each tenant's kept client-state tensors under ``prefix/`` (by digest)."""
    out: dict[str, set[str]] = {}
    for tenant in job.tenants:
        own = layout.JobStores(job).tenant(tenant)
        newest = max(k for k in own.list("client-state/") if k.endswith(".safetensors"))
        kept = own.get_tensors(newest)
        out[tenant.name] = {_digest(t) for n, t in kept.items() if n.startswith(prefix + "/") and t.abs().sum() > 0}
    return out


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["fedpt", "fedmkt", "fewfedpit"])
def test_fedpt_fedmkt_and_fewfedpit_runs_leak_nothing_across_the_boundary(
    make: Any, algorithm: str
) -> None:
    job = _variant_job(make, algorithm)
    workdir = Path(job.workdir)
    tenants = [t.name for t in job.tenants]
    table = readability_table(workdir, tenants)
    _check_key_scopes(job, table)
    stores = layout.JobStores(job)
    sent = _digests_of_broadcasts(stores)
    # Each tenant's update (adapter or knowledge) reaches the provider, never another tenant.
    for tenant in tenants:
        update = stores.exchange(tenant).get_tensors(f"{layout.update_key(1)}.safetensors")
        own = {_digest(t) for t in update.values() if t.numel() and t.abs().sum() > 0} - sent
        assert own, tenant
        for other in (t for t in tenants if t != tenant):
            readable = _tensors_readable_by(table, other)
            leaked = own & set(readable)
            assert not leaked, f"{other} can read {tenant}'s update in {readable[leaked.pop()]}"
    if algorithm == "fedpt":
        # The provider's large model: no tenant can read any of its weights.
        from fedtune.algorithms.registry import get_algorithm

        ctx = ProviderContext.from_job(job)
        large = get_algorithm("fedpt")(job.algorithm).large(ctx).local_model
        secret = {_digest(t) for t in unique_state(large).values()}
        for tenant in tenants:
            assert not secret & set(_tensors_readable_by(table, tenant)), f"{tenant} reads the large model"
    else:
        # What a tenant keeps (FedMKT's own small-model adapter, FewFedPIT's private W^l)
        # is readable by no other party, the provider included.
        kept = _kept_secret(job, "adapter" if algorithm == "fedmkt" else "private")
        for tenant, secret in kept.items():
            assert secret, tenant
            for party in ["provider", *[t for t in tenants if t != tenant]]:
                assert not secret & set(_tensors_readable_by(table, party)), (tenant, party)
