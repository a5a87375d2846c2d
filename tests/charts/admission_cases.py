"""The launcher's real Job manifests and the ways of misusing its rights, as data.

One list shared by the CEL tests (``test_chart_admission.py``, two CEL runtimes) and the
cluster tests (``tests/cluster/test_cluster_admission.py``, the API server itself): every case
here is refused by both, with the same message.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chart_helpers import VALUES_DIR, Rendered, load_yaml

from fedtune.config import parse_job
from fedtune.engines.launcher_manifest import (
    build_job_manifest,
    build_urls_secret,
    load_deployment,
)
from fedtune.engines.tenant.pod_io import StepKind
from tests.kfp.conftest import cluster_job_dict

SCENARIO = "multi-tenant-gpu"
TENANT = "hospital-a"
NAMESPACES = {
    "hospital-a": "fedtune-hospital-a",
    "hospital-b": "fedtune-hospital-b",
    "clinic-c": "clinic-c-federated",
}
Manifest = dict[str, Any]


def tenants_file(rendered: Rendered, tmp_path: Path) -> Path:
    """The rendered tenants ConfigMap's ``tenants.json``, written where the launcher reads it."""
    (config_map,) = [
        c for c in rendered.of_kind("ConfigMap") if c["metadata"]["name"].endswith("-tenants")
    ]
    path = tmp_path / "tenants.json"
    path.write_text(config_map["data"]["tenants.json"])
    return path


def launcher_manifest(tenants_file: Path, tenant: str, kind: StepKind = "client") -> Manifest:
    """The Job the real launcher builds for ``tenant`` from the chart's tenants ConfigMap."""
    raw = cluster_job_dict()
    raw["tenants"] = [
        {
            "name": n,
            "namespace": ns,
            "data_uri": f"s3://{n}-data/train.jsonl",
            "store_uri": f"s3://{n}-data/state",
        }
        for n, ns in NAMESPACES.items()
    ]
    job = parse_job(raw)
    entry = next(t for t in job.tenants if t.name == tenant)
    deployment = load_deployment(entry, str(tenants_file))
    return build_job_manifest(job, tenant, kind, 1, deployment, run_key="run")


URLS = {"get": {"k": "https://x/get?X-Amz-Signature=1"}, "put": {"k": "https://x/put"}}
JOB_UID = "5f0e7a52-8c1d-4f55-9a37-2f1e0c6b9d11"


def launcher_secret(job: Manifest, uid: str = JOB_UID) -> Manifest:
    """The URL Secret the real launcher creates for ``job`` once the API server gave it a uid."""
    return build_urls_secret({**job, "metadata": {**job["metadata"], "uid": uid}}, URLS)


def misused(manifest: Manifest, case: str) -> Manifest:
    """A copy of ``manifest`` with the change of misuse ``case`` applied."""
    job = copy.deepcopy(manifest)
    REJECTED[case][0](job)
    return job


def pod_of(m: Manifest) -> dict[str, Any]:
    return m["spec"]["template"]["spec"]


def container_of(m: Manifest) -> dict[str, Any]:
    return pod_of(m)["containers"][0]


def _set(path: Callable[[Manifest], dict[str, Any]], **fields: Any) -> Callable[[Manifest], None]:
    return lambda m: path(m).update(fields)


def _append(
    path: Callable[[Manifest], dict[str, Any]], key: str, item: Any
) -> Callable[[Manifest], None]:
    return lambda m: path(m).setdefault(key, []).append(item)


def _presigned(m: Manifest) -> dict[str, Any]:
    return next(e for e in container_of(m)["env"] if e["name"] == "FEDTUNE_PRESIGNED")


def _own_urls_as(variable: str) -> Callable[[Manifest], None]:
    """Another variable from the Job's own URL Secret."""
    return lambda m: container_of(m)["env"].append(
        {
            "name": variable,
            "valueFrom": {
                "secretKeyRef": {"name": m["metadata"]["name"] + "-urls", "key": "presigned"}
            },
        }
    )


def _retag(m: Manifest) -> None:
    container_of(m)["image"] = container_of(m)["image"].split("@")[0] + ":0.1.0"


def _init_container(m: Manifest) -> None:
    pod_of(m)["initContainers"] = [{**copy.deepcopy(container_of(m)), "name": "setup"}]


# The scenario's digest on the chart's default registry and repository.
PINNED = (
    "ghcr.io/fedtune/fedtune-gpu@"
    + load_yaml(VALUES_DIR / f"{SCENARIO}.yaml")["image"]["gpuDigest"]
)
OTHER_IMAGE = "evil.example/miner@sha256:" + "0" * 64

# name: (change to the launcher's manifest, the start of the message it must be refused with)
REJECTED: dict[str, tuple[Callable[[Manifest], None], str]] = {
    "another-image": (
        _set(container_of, image=OTHER_IMAGE),
        f"refused image {OTHER_IMAGE}: a tenant Job must run the pinned fedtune image {PINNED}",
    ),
    "tag-not-digest": (
        _retag,
        "refused image ghcr.io/fedtune/fedtune-gpu:0.1.0: a tenant Job must run the pinned",
    ),
    "other-entrypoint": (
        _set(container_of, command=["sh", "-c", "cat /secrets/*"]),
        (
            "refused command or args: a tenant Job must run `python -m "
            "fedtune.entrypoints.client_step|evaluate|audit|secagg_advertise|secagg_share|"
            "secagg_unmask --round N --tenant hospital-a "
            "--presigned`"
        ),
    ),
    "other-module": (
        _set(container_of, command=["python", "-m", "fedtune.entrypoints.aggregate"]),
        "refused command or args",
    ),
    "image-default-entrypoint": (
        lambda m: container_of(m).pop("command"),
        "refused command or args",
    ),
    "other-tenant-arg": (
        lambda m: container_of(m)["args"].__setitem__(3, "hospital-b"),
        "refused command or args",
    ),
    "not-presigned": (lambda m: container_of(m)["args"].pop(), "refused command or args"),
    "job-file-arg": (
        lambda m: container_of(m)["args"].extend(["--job", "/tmp/job.yaml"]),
        "refused command or args",
    ),
    "other-tenants-secret-volume": (
        _append(
            pod_of, "volumes", {"name": "stolen", "secret": {"secretName": "hospital-b-bucket"}}
        ),
        (
            "refused volume stolen: a tenant Job may mount only emptyDir volumes and its "
            "own bucket Secret hospital-a-bucket"
        ),
    ),
    "other-tenants-secret-env": (
        _append(
            container_of,
            "env",
            {
                "name": "AWS_SECRET_ACCESS_KEY",
                "valueFrom": {
                    "secretKeyRef": {"name": "hospital-b-bucket", "key": "secret-access-key"}
                },
            },
        ),
        (
            "refused a reference to Secret hospital-b-bucket: a tenant Job may read no "
            "Secret but the bucket Secret hospital-a-bucket"
        ),
    ),
    "other-tenants-secret-envfrom": (
        _append(container_of, "envFrom", {"secretRef": {"name": "hospital-b-bucket"}}),
        "refused a reference to Secret hospital-b-bucket",
    ),
    "configmap-envfrom": (
        _append(container_of, "envFrom", {"configMapRef": {"name": "proxy"}}),
        "refused a reference to a ConfigMap (envFrom)",
    ),
    "proxy-env": (
        _append(
            container_of, "env", {"name": "HTTPS_PROXY", "value": "http://collector.provider:3128"}
        ),
        (
            "refused environment variable HTTPS_PROXY: a tenant Job sets only "
            "FEDTUNE_JOB_JSON, HF_HUB_OFFLINE=1, "
            "FEDTUNE_S3_ENDPOINT_URL=https://s3.hospital-a.example, cache locations under /tmp, "
            "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_DEFAULT_REGION, "
            "AWS_ENDPOINT_URL_S3 from their own keys of Secret hospital-a-bucket and "
            "FEDTUNE_PRESIGNED from key presigned of the Job's Secret <job name>-urls"
        ),
    ),
    "own-secret-as-other-variable": (
        _append(
            container_of,
            "env",
            {
                "name": "PYTHONPATH",
                "valueFrom": {"secretKeyRef": {"name": "hospital-a-bucket", "key": "endpoint"}},
            },
        ),
        "refused environment variable PYTHONPATH",
    ),
    # The pre-signed URLs: only from the Job's own Secret, under its one key.
    "presigned-as-plain-value": (
        lambda m: (_presigned(m).pop("valueFrom"), _presigned(m).update(value="{}")),
        "refused environment variable FEDTUNE_PRESIGNED",
    ),
    "presigned-from-the-bucket-secret": (
        lambda m: _presigned(m)["valueFrom"]["secretKeyRef"].update(
            name="hospital-a-bucket", key="secret-access-key"
        ),
        "refused environment variable FEDTUNE_PRESIGNED",
    ),
    "presigned-from-another-jobs-secret": (
        lambda m: _presigned(m)["valueFrom"]["secretKeyRef"].update(name="other-job-urls"),
        (
            "refused a reference to Secret other-job-urls: a tenant Job may read no "
            "Secret but the bucket Secret hospital-a-bucket"
        ),
    ),
    "presigned-from-another-secret": (
        lambda m: _presigned(m)["valueFrom"]["secretKeyRef"].update(name="hospital-a-db"),
        "refused a reference to Secret hospital-a-db",
    ),
    "presigned-under-another-key": (
        lambda m: _presigned(m)["valueFrom"]["secretKeyRef"].update(key="token"),
        "refused environment variable FEDTUNE_PRESIGNED",
    ),
    "url-secret-under-another-variable": (
        _own_urls_as("PYTHONSTARTUP"),
        "refused environment variable PYTHONSTARTUP",
    ),
    "bucket-secret-under-a-wrong-key": (
        lambda m: next(
            e for e in container_of(m)["env"] if e["name"] == "AWS_ACCESS_KEY_ID"
        )["valueFrom"]["secretKeyRef"].update(key="secret-access-key"),
        "refused environment variable AWS_ACCESS_KEY_ID",
    ),
    "cache-moved-out-of-scratch": (
        lambda m: next(e for e in container_of(m)["env"] if e["name"] == "HF_HOME").update(
            value="/models"
        ),
        "refused environment variable HF_HOME",
    ),
    "redirected-bucket-endpoint": (
        lambda m: next(
            e for e in container_of(m)["env"] if e["name"] == "FEDTUNE_S3_ENDPOINT_URL"
        ).update(value="http://minio.fedtune:9000"),
        "refused environment variable FEDTUNE_S3_ENDPOINT_URL",
    ),
    "privileged": (
        # Both: the API server refuses privileged with allowPrivilegeEscalation false as invalid.
        lambda m: container_of(m)["securityContext"].update(
            privileged=True, allowPrivilegeEscalation=True
        ),
        "refused container tenant-step: a tenant container may not be privileged",
    ),
    "privilege-escalation": (
        lambda m: container_of(m)["securityContext"].update(allowPrivilegeEscalation=True),
        "refused container tenant-step",
    ),
    "added-capability": (
        lambda m: container_of(m)["securityContext"].update(capabilities={"add": ["SYS_ADMIN"]}),
        "refused container tenant-step",
    ),
    "container-root-user": (
        lambda m: container_of(m)["securityContext"].update(runAsUser=0),
        "refused container tenant-step",
    ),
    "container-may-run-as-root": (
        lambda m: container_of(m)["securityContext"].update(runAsNonRoot=False),
        "refused container tenant-step",
    ),
    "host-port": (
        _set(container_of, ports=[{"containerPort": 22, "hostPort": 22}]),
        "refused container tenant-step",
    ),
    "pod-root-user": (
        lambda m: pod_of(m)["securityContext"].update(runAsUser=0),
        "refused pod securityContext",
    ),
    "pod-may-run-as-root": (
        lambda m: pod_of(m)["securityContext"].update(runAsNonRoot=False),
        "refused pod securityContext",
    ),
    "seccomp-unconfined": (
        lambda m: pod_of(m)["securityContext"].update(seccompProfile={"type": "Unconfined"}),
        "refused pod securityContext",
    ),
    "host-path": (
        _append(pod_of, "volumes", {"name": "host", "hostPath": {"path": "/"}}),
        "refused volume host: a tenant Job may mount only emptyDir volumes",
    ),
    "pvc": (
        _append(
            pod_of,
            "volumes",
            {"name": "data", "persistentVolumeClaim": {"claimName": "tenant-data"}},
        ),
        "refused volume data",
    ),
    "projected-token": (
        _append(
            pod_of,
            "volumes",
            {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}},
        ),
        "refused volume token",
    ),
    "host-network": (_set(pod_of, hostNetwork=True), "refused host namespaces"),
    "host-pid": (_set(pod_of, hostPID=True), "refused host namespaces"),
    "host-ipc": (_set(pod_of, hostIPC=True), "refused host namespaces"),
    "node-name": (
        _set(pod_of, nodeName="provider-node-1"),
        "refused nodeName, hostAliases or dnsConfig",
    ),
    "host-aliases": (
        _set(pod_of, hostAliases=[{"ip": "10.0.0.9", "hostnames": ["s3.hospital-a.example"]}]),
        "refused nodeName, hostAliases or dnsConfig",
    ),
    "dns-config": (
        _set(pod_of, dnsPolicy="None", dnsConfig={"nameservers": ["10.0.0.53"]}),
        "refused nodeName, hostAliases or dnsConfig",
    ),
    "init-container": (
        _init_container,
        (
            "refused a Job with 2 containers (init and ephemeral included): a tenant Job "
            "runs exactly one container"
        ),
    ),
    "second-container": (
        lambda m: pod_of(m)["containers"].append(
            {**copy.deepcopy(container_of(m)), "name": "sidecar"}
        ),
        "refused a Job with 2 containers",
    ),
    "post-start-hook": (
        _set(container_of, lifecycle={"postStart": {"exec": {"command": ["sh", "-c", "env"]}}}),
        "refused lifecycle hook or probe",
    ),
    "exec-probe": (
        _set(container_of, livenessProbe={"exec": {"command": ["sh", "-c", "env"]}}),
        "refused lifecycle hook or probe",
    ),
    "api-token": (
        _set(pod_of, automountServiceAccountToken=True),
        "refused ServiceAccount or API token: a tenant Job runs as ServiceAccount fedtune-tenant",
    ),
    "other-service-account": (
        _set(pod_of, serviceAccountName="tenant-admin"),
        "refused ServiceAccount or API token",
    ),
}


def _secret_meta(m: Manifest) -> dict[str, Any]:
    return m["metadata"]


def _owner(m: Manifest) -> dict[str, Any]:
    return m["metadata"]["ownerReferences"][0]


# name: (change to the launcher's URL Secret, the start of the message it must be refused with)
SECRET_REJECTED: dict[str, tuple[Callable[[Manifest], None], str]] = {
    "not-owned": (
        lambda m: _secret_meta(m).pop("ownerReferences"),
        (
            "refused Secret {name}: the fedtune launcher may create only a Secret named "
            "<job name>-urls and owned, as controller, by that one batch/v1 Job"
        ),
    ),
    "owned-by-another-kind": (
        lambda m: _owner(m).update(apiVersion="apps/v1", kind="ReplicaSet"),
        "refused Secret {name}: the fedtune launcher may create only",
    ),
    "not-as-controller": (
        lambda m: _owner(m).pop("controller"),
        "refused Secret {name}: the fedtune launcher may create only",
    ),
    "two-owners": (
        lambda m: _secret_meta(m)["ownerReferences"].append(
            {**_owner(m), "name": "other", "uid": "u2", "controller": False}
        ),
        "refused Secret {name}: the fedtune launcher may create only",
    ),
    "named-after-no-job": (
        lambda m: _secret_meta(m).update(name="hospital-a-bucket"),
        "refused Secret hospital-a-bucket: the fedtune launcher may create only",
    ),
    "service-account-token": (
        lambda m: (
            m.update(type="kubernetes.io/service-account-token"),
            _secret_meta(m).setdefault("annotations", {}).update(
                {"kubernetes.io/service-account.name": "fedtune-tenant"}
            ),
        ),
        (
            "refused Secret {name}: a Job's URL Secret is immutable, of type Opaque, with the "
            "one key presigned"
        ),
    ),
    "another-key": (
        lambda m: m["data"].update({"credentials": "eA=="}),
        "refused Secret {name}: a Job's URL Secret is immutable",
    ),
    "mutable": (lambda m: m.pop("immutable"), "refused Secret {name}: a Job's URL Secret"),
}


def misused_secret(job: Manifest, case: str) -> tuple[Manifest, str]:
    """The launcher's URL Secret for ``job`` with misuse ``case`` applied, and its message."""
    secret = copy.deepcopy(launcher_secret(job))
    change, message = SECRET_REJECTED[case]
    name = secret["metadata"]["name"]
    change(secret)
    return secret, message.format(name=name)
