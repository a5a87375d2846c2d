"""The local control plane itself: the version Helm sees, pods run by the pod runner, and the
real Job controller and scheduler at work on the fake Node."""

from __future__ import annotations

import base64
import textwrap
from pathlib import Path

import pytest

from tests.cluster.conftest import Cluster, controlplane, wait_for

pytestmark = pytest.mark.cluster

# Prints what a kubelet gave it, then fails with a termination message, as fedtune steps do.
PROBE = textwrap.dedent(
    """
    import json, os, sys
    names = ("PLAIN", "FROM_SECRET", "FROM_CM", "ALL_token", "POD", "KUBERNETES_SERVICE_HOST",
             "AWS_SECRET_ACCESS_KEY")
    seen = {k: os.environ.get(k) for k in names}
    secret, setting, termination = sys.argv[1:]  # mount paths, rewritten by the pod runner
    seen["secret_file"] = open(secret).read()
    seen["cm_file"] = open(setting).read()
    print(json.dumps(seen))
    open(termination, "w").write("probe says no")
    sys.exit(int(os.environ["EXIT"]))
    """
)


def test_the_api_server_reports_the_version_it_was_built_as(cluster: Cluster) -> None:
    from kubernetes import client

    version = client.VersionApi(cluster.api).get_code()
    assert version.git_version == f"v{controlplane.K8S_VERSION}"
    assert (version.major, version.minor) == tuple(controlplane.K8S_VERSION.split(".")[:2])


def test_the_fake_node_is_ready_untainted_and_offers_gpus(cluster: Cluster) -> None:
    node = cluster.core.read_node(controlplane.NODE_NAME)
    ready = {c.type: c.status for c in node.status.conditions}
    assert ready.get("Ready") == "True" and not node.spec.taints
    assert node.status.allocatable["nvidia.com/gpu"] == controlplane.NODE_CAPACITY["nvidia.com/gpu"]


def _probe_pod(name: str, exit_code: int, gpus: int = 0) -> dict:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "probe",
                "image": "python:3.11",
                "command": ["python", "-c", PROBE],
                "args": ["/etc/probe/secret/token", "/etc/probe/cm/setting",
                         "/dev/termination-log"],
                "env": [
                    {"name": "PLAIN", "value": "plain"},
                    {"name": "EXIT", "value": str(exit_code)},
                    {"name": "FROM_SECRET",
                     "valueFrom": {"secretKeyRef": {"name": "probe", "key": "token"}}},
                    {"name": "FROM_CM",
                     "valueFrom": {"configMapKeyRef": {"name": "probe", "key": "setting"}}},
                    {"name": "MISSING", "valueFrom": {
                        "secretKeyRef": {"name": "nope", "key": "x", "optional": True}}},
                    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                ],
                "envFrom": [{"secretRef": {"name": "probe"}, "prefix": "ALL_"}],
                "volumeMounts": [
                    {"name": "secret", "mountPath": "/etc/probe/secret"},
                    {"name": "cm", "mountPath": "/etc/probe/cm"},
                ],
                "resources": {"limits": limits},
            }],
            "volumes": [
                {"name": "secret", "secret": {"secretName": "probe"}},
                {"name": "cm", "configMap": {"name": "probe"}},
            ],
        },
    }


def _probe_objects(cluster: Cluster, ns: str) -> None:
    cluster.core.create_namespaced_secret(ns, {"metadata": {"name": "probe"}, "data": {
        "token": base64.b64encode(b"s3cret").decode()}})
    cluster.core.create_namespaced_config_map(ns, {"metadata": {"name": "probe"}, "data": {
        "setting": "on"}})


def _finished(cluster: Cluster, ns: str, name: str):
    def check():
        pod = cluster.core.read_namespaced_pod(name, ns)
        return pod if pod.status.phase in ("Succeeded", "Failed") else None

    return wait_for(check, f"pod {ns}/{name} to finish")


def test_a_pod_gets_what_a_kubelet_gives_and_reports_its_exit(cluster: Cluster) -> None:
    import json

    ns = cluster.create_namespace("probe-pods")
    _probe_objects(cluster, ns)
    cluster.core.create_namespaced_pod(ns, _probe_pod("ok", 0, gpus=1))
    cluster.core.create_namespaced_pod(ns, _probe_pod("fails", 3))
    ok, fails = _finished(cluster, ns, "ok"), _finished(cluster, ns, "fails")
    # The scheduler placed both on the fake node (one asked for a GPU).
    assert ok.spec.node_name == fails.spec.node_name == controlplane.NODE_NAME
    record = next(r for r in cluster.runner.records if r.pod == "ok")
    assert ok.status.phase == "Succeeded", record.output()
    assert fails.status.phase == "Failed"
    done = fails.status.container_statuses[0].state.terminated
    assert (done.exit_code, done.message) == (3, "probe says no")
    seen = json.loads(record.output())
    assert seen == {
        "PLAIN": "plain", "FROM_SECRET": "s3cret", "FROM_CM": "on", "ALL_token": "s3cret",
        "POD": "ok", "KUBERNETES_SERVICE_HOST": "127.0.0.1", "AWS_SECRET_ACCESS_KEY": None,
        "secret_file": "s3cret", "cm_file": "on",
    }


def test_a_pod_asking_for_more_gpus_than_the_node_has_is_unschedulable(cluster: Cluster) -> None:
    ns = cluster.create_namespace("probe-gpus")
    cluster.core.create_namespaced_pod(ns, _probe_pod("greedy", 0, gpus=64))

    def refused():
        pod = cluster.core.read_namespaced_pod("greedy", ns)
        return [c for c in pod.status.conditions or [] if c.reason == "Unschedulable"]

    (condition,) = wait_for(refused, "the scheduler to refuse the pod")
    assert "nvidia.com/gpu" in condition.message


def test_a_missing_secret_keeps_the_pod_waiting_until_it_exists_like_a_kubelet(
    cluster: Cluster,
) -> None:
    ns = cluster.create_namespace("probe-missing")
    cluster.core.create_namespaced_pod(ns, _probe_pod("orphan", 0))

    def waiting():
        pod = cluster.core.read_namespaced_pod("orphan", ns)
        states = pod.status.container_statuses or []
        return states and states[0].state.waiting

    state = wait_for(waiting, "CreateContainerConfigError")
    assert state.reason == "CreateContainerConfigError" and "probe" in state.message
    assert cluster.core.read_namespaced_pod("orphan", ns).status.phase == "Pending"
    _probe_objects(cluster, ns)  # the Secret appears: the pod starts
    assert _finished(cluster, ns, "orphan").status.phase == "Succeeded"


def test_jobs_complete_and_fail_through_the_real_job_controller(cluster: Cluster) -> None:
    ns = cluster.create_namespace("probe-jobs")

    def job(name: str, code: int) -> dict:
        return {"metadata": {"name": name}, "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "python:3.11",
                            "command": ["python", "-c", f"raise SystemExit({code})"]}]}}}}

    cluster.batch.create_namespaced_job(ns, job("passes", 0))
    cluster.batch.create_namespaced_job(ns, job("breaks", 1))

    def condition(name: str):
        status = cluster.batch.read_namespaced_job(name, ns).status
        return next((c.type for c in status.conditions or [] if c.status == "True"
                     and c.type in ("Complete", "Failed")), None)

    assert wait_for(lambda: condition("passes"), "Job passes") == "Complete"
    assert wait_for(lambda: condition("breaks"), "Job breaks") == "Failed"
    # Background deletion: the garbage collector deletes the pods, the runner removes them.
    cluster.batch.delete_namespaced_job("passes", ns, propagation_policy="Background")
    wait_for(
        lambda: not cluster.core.list_namespaced_pod(ns, label_selector="job-name=passes").items,
        "the Job's pods to go",
    )


def test_a_killed_test_session_leaves_no_control_plane_behind(cluster: Cluster) -> None:
    """A session's control plane is tied to it: SIGKILL the process that started one, and
    etcd and the three servers end too (a leaked API server holds 300 MiB)."""
    import json
    import shutil
    import subprocess
    import sys
    import tempfile

    state = tempfile.mkdtemp(prefix="fedtune-killed-session-")
    script = (
        "import json, sys, time\n"
        "from tests.cluster.conftest import controlplane\n"
        f"plane = controlplane.up({state!r}, tied=True)\n"
        "print(json.dumps(plane.pids), flush=True)\n"
        "time.sleep(600)\n"
    )
    session = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                               text=True, cwd=str(Path(__file__).resolve().parents[2]))
    try:
        pids = json.loads(session.stdout.readline())
    finally:
        session.kill()
        session.wait()
    assert set(pids) == {"etcd", *controlplane.BINARIES}

    def alive(pid: int) -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        return state != "Z"

    wait_for(lambda: not any(alive(p) for p in pids.values()), "the orphans to end", 30)
    shutil.rmtree(state)
