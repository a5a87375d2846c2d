"""Whole jobs whose tenant steps run as Jobs in tenant namespaces of a real API server.

The provider side is driven as KFP tasks drive it: inside a "pod" (``KUBERNETES_SERVICE_HOST``
set, the launcher ServiceAccount's token where the client reads it), each tenant task calls its
component function (``client_step.run``, ``final_step.run``), whose launcher creates the Job
through the real API server under RBAC. The real Job controller and scheduler place its pod on
the fake Node, the pod runner runs it with only what the pod spec gives it (its own bucket
Secret, the pre-signed URLs), and the run must end bitwise equal to the local engine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from fedtune.config import JobConfig
from fedtune.core.messages import ServerState
from fedtune.engines import layout
from fedtune.engines.local import RunOptions, run_job
from fedtune.engines.tenant.pod_io import PRESIGNED_ENV
from fedtune.engines.workers import Outcome, Task
from fedtune.entrypoints import client_step, final_step
from fedtune.tracking.base import NullTracker
from tests.cluster.conftest import Cluster
from tests.cluster.tenants import inside_a_kfp_task, install_tenant, tenant_secret
from tests.helpers.moto import FAKE_SECRET_KEY, create_bucket, start_moto_server, use_fake_aws_env
from tests.kfp.conftest import two_tenant_job
from tests.kfp.test_kfp_local import FEDBIOT

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TENANTS = ("tenant-a", "tenant-b")
QUIET = RunOptions(progress=False)


@pytest.fixture(scope="module")
def platform(cluster: Cluster) -> Cluster:
    """Two tenants as the chart installs them (see tests/cluster/tenants.py)."""
    for tenant in TENANTS:
        install_tenant(cluster, tenant)
    return cluster


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    server = start_moto_server()
    try:
        yield server.endpoint_url
    finally:
        server.stop()


class KfpTenantTasks:
    """The tenant tasks of a KFP round, all at once as a ParallelFor runs them: each calls its
    component function in a thread of its own (a task pod of its own on a cluster)."""

    def __init__(self, job: JobConfig, run_key: str) -> None:
        self.job, self.run_key = job, run_key
        self.markers: list[dict[str, Any]] = []

    def __enter__(self) -> KfpTenantTasks:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def _task(self, task: Task) -> tuple[Outcome, dict[str, Any]]:
        if task.kind in final_step.RESULT_FIELD:  # evaluate, audit
            marker = final_step.run(self.job, task.kind, task.tenant, self.run_key)
            return Outcome(task, marker), marker
        # The client step, or a secure-aggregation round's other tenant steps.
        marker = client_step.run(self.job, task.round_index, task.tenant, self.run_key, task.kind)
        if marker["ok"]:
            return Outcome(task, marker["result"]), marker
        return Outcome(task, None, marker["reason"]), marker

    def run(self, tasks: Sequence[Task], on_done: Any = None) -> dict[str, Outcome]:
        with ThreadPoolExecutor(max_workers=len(tasks)) as pool:
            finished = list(pool.map(self._task, tasks))
        outcomes = {}
        for outcome, marker in finished:
            self.markers.append(marker)
            outcomes[outcome.task.tenant] = outcome
            if on_done:
                on_done(outcome)
        return outcomes


def final_state(job: JobConfig) -> dict[str, torch.Tensor]:
    return ServerState.load(layout.JobStores(job).provider(), layout.state_key(job.rounds)).tensors


def run_on_the_cluster(
    platform: Cluster, settings: dict[str, Any], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, moto_endpoint: str, run_key: str, steps_per_round: int = 1,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The local engine's reference run, then the same job with launched tenant steps
    (``steps_per_round`` of them per tenant and round); assert the final states are bitwise
    equal; return both summaries."""
    settings = {"rounds": 2, **settings}
    reference = two_tenant_job(tmp_path / "reference", **settings)
    expected = run_job(reference, NullTracker(), QUIET)

    use_fake_aws_env(monkeypatch, moto_endpoint)  # the provider's credentials
    bucket = create_bucket(moto_endpoint)
    job = two_tenant_job(tmp_path / "provider", exchange_uri=f"s3://{bucket}/runs",
                         provider_store_uri=f"s3://{bucket}/provider", **settings)
    inside_a_kfp_task(monkeypatch, platform, tmp_path, {t: t for t in TENANTS})
    tasks = KfpTenantTasks(job, run_key)
    monkeypatch.setattr("fedtune.engines.local.tenant_runner", lambda *_: tasks)
    before = len(platform.runner.records)
    got = run_job(job, NullTracker(), QUIET)

    a, b = final_state(reference), final_state(job)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert got["final_eval"] == expected["final_eval"]

    # Every tenant step ran as a pod of a Job in its tenant's namespace, and succeeded.
    runs = platform.runner.records[before:]
    assert sorted((r.namespace, r.exit_code) for r in runs) == sorted(
        (t, 0) for _ in range(job.rounds * steps_per_round + 1) for t in TENANTS
    ), [r.output()[-2000:] for r in runs if r.exit_code]
    steps = [m.get("result", m) for m in tasks.markers]
    assert all(m.get("ok", True) for m in tasks.markers)
    jobs = [s.get("k8s_job") for s in steps if "k8s_job" in s]
    # The evaluate markers carry only metrics.
    assert len(jobs) == job.rounds * steps_per_round * len(TENANTS)
    for namespaced in jobs:
        ns, name = namespaced.split("/")
        stored = platform.batch.read_namespaced_job(name, ns)
        assert any(c.type == "Complete" and c.status == "True" for c in stored.status.conditions)
        # Its URLs were in its own Secret, never in the Job that `get jobs` shows.
        assert "X-Amz-Signature" not in json.dumps(platform.api.sanitize_for_serialization(stored))
    # Each pod had its own bucket credentials and the pre-signed URLs; no provider secret and
    # no way to the exchange store but those URLs.
    for r in runs:
        assert r.env["AWS_SECRET_ACCESS_KEY"] == tenant_secret(r.namespace)["secret-access-key"]
        assert FAKE_SECRET_KEY not in json.dumps(r.env)
        assert "FEDTUNE_S3_ENDPOINT_URL" not in r.env and "AWS_ENDPOINT_URL_S3" not in r.env
        assert json.loads(r.env[PRESIGNED_ENV])["put"]
    return expected, got


def test_fedavg_with_tenant_jobs_on_a_real_api_server_equals_the_local_engine(
    platform: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str
) -> None:
    run_on_the_cluster(platform, {}, tmp_path, monkeypatch, moto_endpoint, "fedavg-run")


def test_fedbiot_with_tenant_jobs_on_a_real_api_server_equals_the_local_engine(
    platform: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str
) -> None:
    expected, got = run_on_the_cluster(
        platform, FEDBIOT, tmp_path, monkeypatch, moto_endpoint, "fedbiot-run"
    )
    assert got["emulator_layers"] == expected["emulator_layers"]


def test_a_secure_round_with_tenant_jobs_on_a_real_api_server_equals_the_local_engine(
    platform: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str
) -> None:
    """Advertise, share, masked client step and unmask: four Jobs per tenant and round."""
    secure = {"rounds": 1, "secure_aggregation": {"enabled": True, "threshold": 2}}
    run_on_the_cluster(platform, secure, tmp_path, monkeypatch, moto_endpoint, "secure-run",
                       steps_per_round=4)
    for tenant in TENANTS:
        launched = platform.batch.list_namespaced_job(tenant, label_selector="fedtune.io/step")
        kinds = {j.metadata.labels["fedtune.io/step"] for j in launched.items}
        assert kinds >= {"secagg-advertise", "secagg-share", "client", "secagg-unmask"}
