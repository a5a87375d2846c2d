"""The launcher's wait loop against a scripted API: success, failure, timeout, re-attach, RBAC."""

from __future__ import annotations

import copy
import inspect
import re
import time
from pathlib import Path
from typing import Any

import pytest

from fedtune.config import parse_job
from fedtune.core.errors import ConfigError, FedtuneError, TenantFailure
from fedtune.engines.launcher import JobApi, KubernetesJobApi, launch, wait_for_job
from fedtune.engines.launcher_manifest import LauncherSettings, TenantDeployment, build_job_manifest
from fedtune.engines.launcher_rbac import LAUNCHER_RULES
from tests.kfp.conftest import cluster_job_dict
from tests.kfp.fake_k8s import FakeClock, FakeJobApi, State, job_status, pod

SETTINGS = LauncherSettings(active_deadline_s=60, grace_s=30, poll_s=10)
NS = "fedtune-tenant-a"
URLS = {"get": {"a.bin": "https://exchange.example/a?sig=1"}, "put": {}}


def the_manifest() -> dict[str, Any]:
    job = parse_job(cluster_job_dict())
    deployment = TenantDeployment(NS, "tenant-a-bucket")
    return build_job_manifest(
        job,
        "tenant-a",
        "client",
        1,
        deployment,
        run_key="run-1",
        settings=SETTINGS,
    )


def run_success() -> FakeJobApi:
    api = FakeJobApi(
        [
            State(job_status(active=1)),  # the Job controller has not made a pod yet
            State(job_status(active=1), [pod("p1", phase="Pending")]),
            State(job_status(active=1), [pod("p1")]),
            State(job_status("Complete", succeeded=1), [pod("p1", phase="Succeeded", exit_code=0)]),
        ]
    )
    outcome = launch(api, the_manifest(), URLS, settings=SETTINGS, clock=api.clock)
    assert not outcome.reattached and outcome.namespace == NS
    assert outcome.seconds == pytest.approx(30.0)  # three 10 s waits of the fake clock
    return api


SECRET = "patient 4711 has condition X"  # record text: must never reach the provider


def run_failure(message: str | None = '{"kind": "DataError", "record": 7}') -> tuple[FakeJobApi, FedtuneError]:
    api = FakeJobApi(
        [
            State(job_status(active=1), [pod("p1")]),
            State(
                job_status(
                    "Failed", "BackoffLimitExceeded", "Job has reached the backoff limit", failed=2
                ),
                [
                    pod("p0", created="2026-01-01T00:00:00Z", exit_code=3),
                    pod(
                        "p1",
                        created="2026-01-01T00:05:00Z",
                        phase="Failed",
                        exit_code=3,
                        message=message,
                    ),
                ],
            ),
        ],
    )
    with pytest.raises(FedtuneError) as info:
        launch(api, the_manifest(), URLS, settings=SETTINGS, clock=api.clock)
    return api, info.value


def run_timeout() -> tuple[FakeJobApi, FedtuneError]:
    stuck = pod("p1", phase="Pending", unschedulable="0/3 nodes have nvidia.com/gpu")
    api = FakeJobApi([State(job_status(active=1), [stuck])])
    with pytest.raises(FedtuneError) as info:
        launch(api, the_manifest(), URLS, settings=SETTINGS, clock=api.clock)
    return api, info.value


def running(manifest: dict[str, Any]) -> dict[str, Any]:
    """The Job as an earlier attempt left it: created (a uid) and resumed."""
    job = copy.deepcopy(manifest)
    job["metadata"]["uid"] = "uid-earlier"
    job["spec"]["suspend"] = False
    return job


def run_reattach() -> FakeJobApi:
    existing = running(the_manifest())
    api = FakeJobApi(
        [State(job_status(active=1), [pod("p1")]), State(job_status("Complete", succeeded=1))],
        existing=existing,
    )
    outcome = launch(api, the_manifest(), URLS, settings=SETTINGS, clock=api.clock)
    assert outcome.reattached
    return api


def test_success_waits_on_the_job_then_on_its_pods() -> None:
    api = run_success()
    assert api.calls.count("create_job") == 1
    assert api.calls.count("watch_job") == 1  # before any pod existed
    assert api.calls.count("watch_pods") == 2  # while the pod was pending / running
    assert api.deleted == []


def test_failure_reports_exit_code_kind_and_line_from_the_pod_status_never_its_log() -> None:
    api, error = run_failure()
    text = str(error)
    assert "BackoffLimitExceeded" in text
    assert "pod p1 exited with code 3 (DataError)" in text
    assert "DataError at line 7: the tenant's dataset or one of its records cannot be used" in text
    assert error.redacted() == TenantFailure(kind="DataError", record=7)
    assert "read_pod_log" not in api.calls
    assert "logs p1" in error.fix and "re-run" in error.fix


@pytest.mark.parametrize(
    "forged",
    [
        pytest.param(SECRET, id="free-text"),
        pytest.param('{"kind": "DataError", "record": "' + SECRET + '"}', id="text-as-record"),
        pytest.param('{"kind": "' + SECRET + '", "record": 1}', id="unknown-kind"),
        pytest.param('{"kind": "DataError", "record": 1, "note": "' + "x" * 5000 + '"}', id="huge"),
        pytest.param(None, id="none"),
    ],
)
def test_a_forged_termination_message_yields_only_a_generic_failure(forged: str | None) -> None:
    _, error = run_failure(forged)
    assert SECRET not in str(error) and "x" * 100 not in str(error)
    assert error.redacted() == TenantFailure(kind="FedtuneError", record=None)


def test_timeout_deletes_the_job_and_says_why_it_did_not_run() -> None:
    started = time.perf_counter()
    api, error = run_timeout()
    assert time.perf_counter() - started < 1.0  # fake clock: no real waiting
    assert "did not finish within 90 s" in str(error)
    assert "Unschedulable: 0/3 nodes have nvidia.com/gpu" in str(error)
    assert len(api.deleted) == 1
    assert "node selector" in error.fix


QUOTA = (
    'Error creating: pods "kfp-c1-tenant-a-x" is forbidden: exceeded quota: fedtune-quota, '
    "requested: requests.nvidia.com/gpu=2, used: requests.nvidia.com/gpu=1, "
    "limited: requests.nvidia.com/gpu=1"
)
SLOW_START = LauncherSettings(active_deadline_s=6 * 3600, poll_s=10, start_timeout_s=120)


def failed_create(message: str, count: int = 1) -> dict[str, Any]:
    """A Job event as the Job controller records a pod it could not create."""
    return {"type": "Warning", "reason": "FailedCreate", "message": message, "count": count}


def run_quota_rejection() -> tuple[FakeJobApi, FedtuneError]:
    api = FakeJobApi(
        [State(job_status(active=0)), State(job_status(), events=[failed_create(QUOTA)])]
    )
    with pytest.raises(FedtuneError) as info:
        launch(api, the_manifest(), URLS, settings=SLOW_START, clock=api.clock)
    return api, info.value


def test_a_quota_rejection_fails_the_step_within_the_start_timeout_naming_the_reason() -> None:
    api, error = run_quota_rejection()
    # The first rejection is seen after one 10 s poll; 120 s later the step gives up, not 6 h.
    assert api.clock.now - FakeClock().now <= 10 + 120 + 10
    assert "exceeded quota: fedtune-quota" in str(error) and "FailedCreate" in str(error)
    assert "could not start its pod for 120 s" in str(error)
    assert len(api.deleted) == 1
    assert "kubectl -n fedtune-tenant-a describe job" in error.fix


def test_an_admission_denial_or_unschedulable_pod_fails_the_same_way() -> None:
    denied = failed_create(
        'Error creating: pods "p" is forbidden: violates PodSecurity "restricted:latest"'
    )
    api = FakeJobApi([State(job_status(), events=[denied])])
    with pytest.raises(FedtuneError, match='violates PodSecurity "restricted:latest"'):
        launch(api, the_manifest(), URLS, settings=SLOW_START, clock=api.clock)
    stuck = pod("p1", phase="Pending", unschedulable="0/3 nodes are available: 3 Insufficient gpu")
    api = FakeJobApi([State(job_status(active=1), [stuck])])
    with pytest.raises(FedtuneError, match="Unschedulable: 0/3 nodes are available"):
        launch(api, the_manifest(), URLS, settings=SLOW_START, clock=api.clock)
    assert api.clock.now - FakeClock().now <= 120 + 10


def test_a_pod_that_is_scheduled_late_is_not_failed() -> None:
    stuck = pod("p1", phase="Pending", unschedulable="0/3 nodes: scaling up")
    api = FakeJobApi(
        [
            State(job_status(), events=[failed_create(QUOTA)]),  # quota frees up after a while
            *[State(job_status(active=1), [stuck])] * 11,  # blocked 110 s of the 120 allowed
            State(job_status(active=1), [pod("p1")]),
            State(job_status("Complete", succeeded=1), [pod("p1", phase="Succeeded")]),
        ]
    )
    assert launch(api, the_manifest(), URLS, settings=SLOW_START, clock=api.clock).seconds == 130


def test_a_pod_that_cannot_start_fails_fast_and_names_the_missing_secret() -> None:
    waiting = {
        "reason": "CreateContainerConfigError",
        "message": 'secret "tenant-a-bucket" not found',
    }
    api = FakeJobApi([State(job_status(active=1), [pod("p1", phase="Pending", waiting=waiting)])])
    with pytest.raises(FedtuneError, match='secret "tenant-a-bucket" not found') as info:
        launch(api, the_manifest(), URLS, settings=SETTINGS, clock=api.clock)
    assert api.deleted and api.calls.count("watch_pods") == 0
    assert "bucket Secret" in info.value.fix


def test_retry_reattaches_to_the_existing_job_instead_of_starting_another() -> None:
    api = run_reattach()
    assert api.created == [] and api.secrets == {}  # nothing new was created
    assert api.calls[:2] == ["create_job", "read_job"]
    assert "resume_job" not in api.calls  # it runs already


def test_the_job_is_created_suspended_and_resumed_once_its_url_secret_exists() -> None:
    api = run_success()
    assert api.calls[:3] == ["create_job", "create_secret", "resume_job"]
    (job,) = api.created
    (secret,) = api.secrets.values()
    assert secret["metadata"]["name"] == f"{job['metadata']['name']}-urls"
    (owner,) = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "Job", job["metadata"]["name"], job["metadata"]["uid"]
    )
    assert job["spec"]["suspend"] is False


def test_a_retry_resumes_a_job_an_earlier_attempt_left_suspended() -> None:
    """The earlier attempt stopped between creating the Job and resuming it."""
    left = the_manifest()
    left["metadata"]["uid"] = "uid-earlier"
    api = FakeJobApi([State(job_status("Complete", succeeded=1))], existing=left)
    api.secrets[f"{left['metadata']['name']}-urls"] = {"data": {}}  # it got that far, too
    assert launch(api, the_manifest(), URLS, settings=SETTINGS, clock=api.clock).reattached
    assert api.calls[:4] == ["create_job", "read_job", "create_secret", "resume_job"]
    assert left["spec"]["suspend"] is False


def test_a_secret_in_the_way_of_a_new_job_is_refused_and_the_job_deleted() -> None:
    """A Secret of that name that the launcher did not make with this Job (it cannot read
    it to check): the pod would read URLs that someone else chose."""
    api = FakeJobApi([State(job_status(active=1))])
    name = the_manifest()["metadata"]["name"]
    api.secrets[f"{name}-urls"] = {"data": {}}
    with pytest.raises(ConfigError, match=f"Secret {NS}/{name}-urls exists already") as info:
        launch(api, the_manifest(), URLS, settings=SETTINGS, clock=api.clock)
    assert f"kubectl -n {NS} delete secret {name}-urls" in info.value.fix
    assert api.deleted == [name] and "resume_job" not in api.calls


def test_reattach_refuses_a_job_of_another_step() -> None:
    other = copy.deepcopy(the_manifest())
    other["metadata"]["labels"]["fedtune.io/step-id"] = "0000000000"
    api = FakeJobApi([State(job_status(active=1))], existing=other)
    with pytest.raises(ConfigError, match="belongs to another step"):
        launch(api, the_manifest(), URLS, settings=SETTINGS, clock=api.clock)


def test_a_job_that_vanishes_is_reported() -> None:
    api = FakeJobApi([State(job_status(active=1))])
    api._body = the_manifest()
    api.deleted.append(api._body["metadata"]["name"])
    with pytest.raises(FedtuneError, match="disappeared"):
        wait_for_job(api, NS, api._body["metadata"]["name"], settings=SETTINGS, clock=FakeClock())


# -- RBAC ----------------------------------------------------------------------------------------
def _expand(rules: list[dict[str, list[str]]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_permissions_the_launcher_uses_are_exactly_launcher_rules() -> None:
    protocol = {
        n for n, _ in inspect.getmembers(JobApi, inspect.isfunction) if not n.startswith("_")
    }
    assert protocol == set(KubernetesJobApi.PERMISSIONS)
    used: set[str] = set()
    for scenario in (run_success, run_failure, run_timeout, run_reattach, run_quota_rejection):
        result = scenario()
        api = result[0] if isinstance(result, tuple) else result
        used |= set(api.calls)
    assert used == set(KubernetesJobApi.PERMISSIONS), "a permission is granted but never used"
    needed = set(KubernetesJobApi.PERMISSIONS.values())
    granted = _expand(LAUNCHER_RULES)
    assert needed == granted
    assert not any(resource == "pods/log" for _, resource, _ in granted)  # logs stay the tenant's
    # Secrets: create only (each Job's URL Secret); never read, list or change one.
    assert {v for _, r, v in granted if r == "secrets"} == {"create"}


# -- the Kubernetes client boundary --------------------------------------------------------------
def test_only_the_launcher_imports_the_kubernetes_client() -> None:
    import fedtune

    src = Path(fedtune.__file__).parent
    importers = sorted(
        str(p.relative_to(src))
        for p in src.rglob("*.py")
        if re.search(r"^\s*(import kubernetes|from kubernetes\b)", p.read_text(), re.MULTILINE)
    )
    assert importers == ["engines/launcher.py"]


def test_outside_a_pod_the_real_api_says_it_has_no_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    with pytest.raises(ConfigError, match="no in-cluster Kubernetes credentials") as info:
        KubernetesJobApi()
    assert "ServiceAccount" in info.value.fix
