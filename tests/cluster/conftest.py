"""A real Kubernetes control plane for the ``cluster`` tests (one per test session).

The ``cluster`` fixture builds (or reuses) kube-apiserver, kube-controller-manager and
kube-scheduler from the Kubernetes sources (scripts/k8s/controlplane.py), starts them with etcd
on 127.0.0.1, registers a fake Node, and runs the pods bound to it as local processes
(tests/cluster/pod_runner.py). Without ``go`` (and no cached binaries) the tests are skipped; a
build or start that fails fails them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.pod_runner import PodRunner

REPO = Path(__file__).resolve().parents[2]


def _load_controlplane() -> Any:
    spec = importlib.util.spec_from_file_location(
        "fedtune_controlplane", REPO / "scripts" / "k8s" / "controlplane.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


controlplane = _load_controlplane()


@dataclass
class Cluster:
    """The running control plane, an admin client, and the pod runner."""

    plane: Any  # controlplane.ControlPlane
    api: Any  # kubernetes.client.ApiClient, as cluster admin
    runner: PodRunner

    @property
    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api)

    @property
    def batch(self) -> Any:
        from kubernetes import client

        return client.BatchV1Api(self.api)

    @property
    def host_port(self) -> tuple[str, int]:
        url = urllib.parse.urlsplit(self.plane.server)
        return url.hostname or "127.0.0.1", int(url.port or 443)

    def create_namespace(self, name: str, labels: dict[str, str] | None = None) -> str:
        """A namespace, once its ``default`` ServiceAccount exists (pods need it)."""
        self.core.create_namespace({"metadata": {"name": name, "labels": labels or {}}})
        wait_for(lambda: self.core.list_namespaced_service_account(
            name, field_selector="metadata.name=default").items, f"default SA in {name}")
        wait_for(lambda: self.core.list_namespaced_config_map(
            name, field_selector="metadata.name=kube-root-ca.crt").items,
            f"kube-root-ca.crt in {name}")
        return name

    def token(self, namespace: str, service_account: str, seconds: int = 3600) -> str:
        """A bound token of the ServiceAccount, as a pod of it would be given."""
        from kubernetes import client

        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=seconds)
        )
        issued = self.core.create_namespaced_service_account_token(
            service_account, namespace, request
        )
        return issued.status.token

    def requests_of(self, namespace: str, service_account: str) -> list[dict[str, Any]]:
        """What the ServiceAccount asked the API server, from its audit log, oldest first:
        dicts of verb, group, resource, namespace, name and the response code.

        One entry per request, from its first event: a watch's is ``ResponseStarted``, logged
        (the log blocks) before the client sees the watch start; its ``ResponseComplete``
        comes whenever the server notices the client left."""
        user = f"system:serviceaccount:{namespace}:{service_account}"
        found, seen = [], set()
        for line in self.plane.audit_log.read_text().splitlines():
            event = json.loads(line)
            if event["user"]["username"] != user or event["auditID"] in seen:
                continue
            seen.add(event["auditID"])
            ref = event.get("objectRef") or {}
            found.append({
                "verb": event["verb"], "group": ref.get("apiGroup", ""),
                "resource": ref.get("resource", ""), "namespace": ref.get("namespace", ""),
                "name": ref.get("name", ""), "code": event["responseStatus"]["code"],
            })
        return found

    def client_as(self, namespace: str, service_account: str) -> Any:
        """An ApiClient that authenticates as the ServiceAccount (RBAC applies)."""
        from kubernetes import client

        conf = client.Configuration()
        conf.host = self.plane.server
        conf.ssl_ca_cert = self.plane.ca_file
        conf.api_key = {"authorization": "Bearer " + self.token(namespace, service_account)}
        return client.ApiClient(conf)


def wait_for(check: Any, what: str, timeout_s: float = 60.0, every_s: float = 0.2) -> Any:
    """Poll ``check`` until it returns something truthy; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every_s)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _binaries_or_skip() -> None:
    cached = controlplane.cache_dir() / "bin"
    if shutil.which("go") is None and not all((cached / b).exists() for b in controlplane.BINARIES):
        pytest.skip(
            "no `go` on PATH and no cached Kubernetes binaries in "
            f"{cached}: install Go 1.26 to run the cluster tests"
        )
    try:
        controlplane.build()
    except controlplane.ControlPlaneError as exc:
        pytest.fail(f"building the Kubernetes control plane failed: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """A running control plane with the fake Node and its pod runner; stopped afterwards."""
    _binaries_or_skip()
    from kubernetes import config

    # Not under pytest's basetemp: a concurrent pytest session on the machine may rotate it
    # away (it keeps three), and with it the etcd data and the audit log.
    state = Path(tempfile.mkdtemp(prefix="fedtune-controlplane-"))
    try:
        plane = controlplane.up(state, tied=True)  # gone with pytest, even after a kill -9
    except controlplane.ControlPlaneError as exc:
        pytest.fail(f"starting the Kubernetes control plane failed: {exc}", pytrace=False)
    api = config.new_client_from_config(config_file=plane.kubeconfig)
    from kubernetes import client

    host, port = Cluster(plane, api, None).host_port  # type: ignore[arg-type]
    runner = PodRunner(
        core=client.CoreV1Api(api),
        node=controlplane.NODE_NAME,
        workdir=state / "pods",
        server_host=host,
        server_port=port,
        # What the image provides: the code under test and an interpreter's basics.
        base_env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
            "OMP_NUM_THREADS": "1",
            "LANG": "C.UTF-8",
        },
    ).start()
    try:
        yield Cluster(plane, api, runner)
    finally:
        runner.stop()
        api.close()
        controlplane.down(state)
        shutil.rmtree(state, ignore_errors=True)
