"""What the tenant launcher creates: the ``batch/v1`` Job of one tenant step, as plain data.

Pure functions over the job config and the cluster's tenants file, kept apart from the
Kubernetes client so that every field can be unit-tested (and read) without a cluster. The
Job runs in the tenant's namespace with the tenant's own bucket Secret; the provider's
credentials never appear in it — the pod reaches the exchange store only through the
pre-signed URLs it is given.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedtune.config.base import check_dns1123_label
from fedtune.config.job import JobConfig, TenantConfig
from fedtune.core.errors import ConfigError
from fedtune.entrypoints.common import JOB_ENV
from fedtune.entrypoints.tenant_io import PRESIGNED_ENV, StepKind, tenant_copy
from fedtune.pipelines.images import tenant_image

TENANTS_FILE_ENV = "FEDTUNE_TENANTS_FILE"
DEFAULT_TENANTS_FILE = "/etc/fedtune/tenants.json"
"""Where the chart's tenants ConfigMap (namespaces, Secret names, image) is mounted."""

STEP_MODULES: dict[str, str] = {
    "client": "fedtune.entrypoints.client_step",
    "evaluate": "fedtune.entrypoints.evaluate",
    "audit": "fedtune.entrypoints.audit",
}
RUN_AS = 10001  # the images' non-root user; tenant namespaces enforce the restricted profile
_TENANTS_FIX = (
    "Install the tenant with the fedtune Helm chart (it mounts this file into launcher tasks)."
)


@dataclass(frozen=True)
class LauncherSettings:
    """Limits of a launched Job and of the wait for it."""

    backoff_limit: int = 2
    active_deadline_s: int = 6 * 3600
    ttl_s: int = 24 * 3600
    poll_s: float = 10.0
    grace_s: float = 600.0  # beyond the Job's own deadline: API lag, final pod status

    @property
    def url_expiry_s(self) -> int:
        """Pre-signed URLs outlive the Job's deadline; S3 caps them at 7 days."""
        return int(min(7 * 24 * 3600, self.active_deadline_s + self.grace_s + 3600))


DEFAULT_SETTINGS = LauncherSettings()
TERMINATION_LOG = "/dev/termination-log"


@dataclass(frozen=True)
class TenantDeployment:
    """Where and as whom a tenant's pods run (from the chart's tenants ConfigMap)."""

    namespace: str
    bucket_secret: str
    service_account: str | None = None
    bucket_endpoint: str | None = None
    image: str | None = None
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)


def _namespace(tenant: str, value: str) -> str:
    try:
        return check_dns1123_label(value)
    except ValueError as exc:
        raise ConfigError(f"tenant {tenant!r}: namespace {exc}", fix=_TENANTS_FIX) from None


def load_deployment(tenant: TenantConfig, path: str | None = None) -> TenantDeployment:
    """Read the tenant's entry of the tenants file and check it against the job config.

    Raises:
        ConfigError: The file is missing or malformed, the tenant is not installed, its
            namespace is not a DNS-1123 label or differs from the job's, or it names no Secret.
    """
    path = path or os.environ.get(TENANTS_FILE_ENV) or DEFAULT_TENANTS_FILE
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        entries = list(doc.get("tenants") or [])
    except (OSError, json.JSONDecodeError, AttributeError) as exc:
        raise ConfigError(
            f"cannot read the tenants file {path!r}: {exc}", fix=_TENANTS_FIX
        ) from None
    entry = next((t for t in entries if t.get("name") == tenant.name), None)
    if entry is None:
        raise ConfigError(
            f"tenant {tenant.name!r} is not in the cluster's tenants file {path!r}",
            fix=_TENANTS_FIX,
        )
    namespace = _namespace(tenant.name, entry.get("namespace") or tenant.k8s_namespace)
    if namespace != tenant.k8s_namespace:
        raise ConfigError(
            f"tenant {tenant.name!r} runs in namespace {namespace!r} in this cluster, but the "
            f"job config says {tenant.k8s_namespace!r}",
            fix=f"Set `namespace: {namespace}` on the tenant in the job file.",
        )
    if not entry.get("bucketSecretName"):
        raise ConfigError(
            f"tenant {tenant.name!r} has no bucketSecretName in {path!r}", fix=_TENANTS_FIX
        )
    return TenantDeployment(
        namespace=namespace,
        bucket_secret=entry["bucketSecretName"],
        service_account=entry.get("serviceAccountName") or None,
        bucket_endpoint=entry.get("bucketEndpoint") or None,
        image=doc.get("image") or None,
        node_selector=dict(entry.get("nodeSelector") or {}),
        tolerations=list(entry.get("tolerations") or []),
    )


def job_name(
    job: str, kind: StepKind, round_index: int, tenant: str, run_key: str
) -> tuple[str, str]:
    """A DNS-1123 Job name unique to (job, step, round, tenant, run), and its step id.

    The same inputs always give the same name, so a retried launcher finds its Job; a new
    pipeline run (another ``run_key``) starts a fresh one.
    """
    digest = hashlib.sha256(f"{job}/{kind}/{round_index}/{tenant}/{run_key}".encode())
    step_id = digest.hexdigest()[:10]
    return f"{job[:20]}-{kind[0]}{round_index}-{tenant[:20]}-{step_id}", step_id


def build_job_manifest(
    job: JobConfig,
    tenant_name: str,
    kind: StepKind,
    round_index: int,
    deployment: TenantDeployment,
    urls: dict[str, dict[str, str]],
    *,
    run_key: str = "",
    settings: LauncherSettings = DEFAULT_SETTINGS,
) -> dict[str, Any]:
    """The ``batch/v1`` Job that runs one tenant step in the tenant's namespace."""
    tenant = next(t for t in job.tenants if t.name == tenant_name)
    namespace = _namespace(tenant_name, deployment.namespace)
    name, step_id = job_name(job.name, kind, round_index, tenant_name, run_key)
    labels = {
        "app.kubernetes.io/part-of": "fedtune",
        "app.kubernetes.io/component": "tenant-step",
        "fedtune.io/job": job.name,
        "fedtune.io/tenant": tenant_name,
        "fedtune.io/step": kind,
        "fedtune.io/round": str(round_index),
        "fedtune.io/step-id": step_id,
    }
    res = tenant.resources
    limits: dict[str, str] = {"cpu": res.cpu, "memory": res.memory}
    if res.gpu:
        limits["nvidia.com/gpu"] = str(res.gpu)
    visible_job = tenant_copy(job, tenant_name).model_dump(mode="json")
    env = [
        {"name": JOB_ENV, "value": json.dumps(visible_job, sort_keys=True)},
        {"name": PRESIGNED_ENV, "value": json.dumps(urls, sort_keys=True)},
        {"name": "HOME", "value": "/tmp"},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
    ]
    if deployment.bucket_endpoint:
        env.append({"name": "FEDTUNE_S3_ENDPOINT_URL", "value": deployment.bucket_endpoint})
    extra_tolerations = [t for t in res.tolerations if t not in deployment.tolerations]
    container = {
        "name": "tenant-step",
        "image": deployment.image or tenant_image(),
        "command": ["python", "-m", STEP_MODULES[kind]],
        "args": ["--round", str(round_index), "--tenant", tenant_name, "--presigned"],
        "env": env,
        # The tenant's own bucket credentials, from a Secret the provider never reads.
        "envFrom": [{"secretRef": {"name": deployment.bucket_secret}}],
        "resources": {"requests": {"cpu": res.cpu, "memory": res.memory}, "limits": limits},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
        },
        "volumeMounts": [{"name": "scratch", "mountPath": "/tmp"}],
        # On failure the step writes only its redacted failure (kind + line) here; the
        # launcher reads it from the pod status, never the log (which stays the tenant's).
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "fsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "nodeSelector": {**deployment.node_selector, **res.node_selector},
        "tolerations": [*deployment.tolerations, *extra_tolerations],
        "containers": [container],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
    }
    if deployment.service_account:
        pod_spec["serviceAccountName"] = deployment.service_account
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "backoffLimit": settings.backoff_limit,
            "activeDeadlineSeconds": settings.active_deadline_s,
            "ttlSecondsAfterFinished": settings.ttl_s,
            "template": {
                # Kubeflow profile namespaces inject Istio; a Job pod with a sidecar never ends.
                "metadata": {"labels": labels, "annotations": {"sidecar.istio.io/inject": "false"}},
                "spec": pod_spec,
            },
        },
    }
