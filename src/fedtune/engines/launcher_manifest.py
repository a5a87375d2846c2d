"""What the tenant launcher creates: the ``batch/v1`` Job of one tenant step and the Secret
that hands it its pre-signed URLs, as plain data.

Pure functions over the job config and the cluster's tenants file, kept apart from the
Kubernetes client so that every field can be unit-tested (and read) without a cluster. The
Job runs in the tenant's namespace with the tenant's own bucket Secret; the provider's
credentials never appear in it — the pod reaches the exchange store only through the
pre-signed URLs it is given. Those URLs are bearer credentials for the step's objects, so they
are not in the Job (anyone who may `get jobs` or `get pods` in the tenant's namespace reads a
Job's env) but in a Secret of their own, named after the Job and owned by it
(:func:`build_urls_secret`), which the pod reads through ``secretKeyRef``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedtune.config.base import check_dns1123_label
from fedtune.config.job import JobConfig, TenantConfig
from fedtune.config.tenant_view import tenant_view
from fedtune.core.cpu import THREADS_ENV
from fedtune.core.errors import (
    ConfigError,
    FedtuneError,
    StopRequested,
    StoreUnavailable,
    error_classes,
)
from fedtune.core.images import TENANT_IMAGE_ENV, tenant_image
from fedtune.engines.tenant.pod_io import JOB_ENV, PRESIGNED_ENV, StepKind

TENANTS_FILE_ENV = "FEDTUNE_TENANTS_FILE"
DEFAULT_TENANTS_FILE = "/etc/fedtune/tenants.json"
"""Where the chart's tenants ConfigMap (namespaces, Secret names, image) is mounted."""

STEP_MODULES: dict[str, str] = {
    "client": "fedtune.entrypoints.client_step",
    "evaluate": "fedtune.entrypoints.evaluate",
    "audit": "fedtune.entrypoints.audit",
    "secagg-advertise": "fedtune.entrypoints.secagg_advertise",
    "secagg-share": "fedtune.entrypoints.secagg_share",
    "secagg-unmask": "fedtune.entrypoints.secagg_unmask",
}
RUN_AS = 10001  # the images' non-root user; tenant namespaces enforce the restricted profile
_TENANTS_FIX = (
    "Install the tenant with the fedtune Helm chart (it mounts this file into launcher tasks)."
)


TENANT_SECRET_ENV: tuple[tuple[str, str, bool], ...] = (
    ("AWS_ACCESS_KEY_ID", "access-key-id", False),
    ("AWS_SECRET_ACCESS_KEY", "secret-access-key", False),
    ("AWS_SESSION_TOKEN", "session-token", True),
    ("AWS_DEFAULT_REGION", "region", True),
    ("AWS_ENDPOINT_URL_S3", "endpoint", True),
)
"""(variable boto3 reads, key of the tenant's bucket Secret, optional) for every credential.

Mapped one by one with ``secretKeyRef``: ``envFrom`` would export the Secret's own key names,
which boto3 ignores."""

URLS_SECRET_SUFFIX = "-urls"
URLS_SECRET_KEY = "presigned"
"""The Job's URL Secret is ``<job name>-urls`` with the URLs' JSON under this one key; the
chart's admission policy pins both."""


def urls_secret_name(job_name: str) -> str:
    """The name of the Secret that holds the pre-signed URLs of the Job ``job_name``."""
    return f"{job_name}{URLS_SECRET_SUFFIX}"


def build_urls_secret(job: dict[str, Any], urls: dict[str, dict[str, str]]) -> dict[str, Any]:
    """The Secret with the Job's pre-signed URLs, owned by the created Job (its ``uid``).

    The ownerReference makes Kubernetes' garbage collector delete the Secret with its Job
    (the Job's TTL or the launcher's delete), so no URL outlives the Job in the namespace.
    ``blockOwnerDeletion`` is left out: setting it needs ``update`` on ``jobs/finalizers``.
    Immutable: the kubelet then stops watching it, and nobody can swap the URLs under the pod.
    """
    meta = job["metadata"]
    payload = json.dumps(urls, sort_keys=True).encode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": urls_secret_name(meta["name"]),
            "namespace": meta["namespace"],
            "labels": dict(meta.get("labels") or {}),
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                }
            ],
        },
        "type": "Opaque",
        "immutable": True,
        "data": {URLS_SECRET_KEY: base64.b64encode(payload).decode("ascii")},
    }


SCRATCH = "/tmp"
CACHE_ENV: dict[str, str] = {
    "HOME": SCRATCH,
    "TMPDIR": SCRATCH,
    "XDG_CACHE_HOME": f"{SCRATCH}/cache",
    "HF_HOME": f"{SCRATCH}/cache/huggingface",
    "TORCH_HOME": f"{SCRATCH}/cache/torch",
    "TRITON_CACHE_DIR": f"{SCRATCH}/cache/triton",
    "MPLCONFIGDIR": f"{SCRATCH}/cache/matplotlib",
}
"""Every place a library writes at run time, inside the pod's one writable volume (the root
filesystem is read-only); MLflow writes only temporary files (``TMPDIR``)."""


@dataclass(frozen=True)
class LauncherSettings:
    """Limits of a launched Job and of the wait for it (the chart's ``tenantDefaults.job``)."""

    backoff_limit: int = 2
    active_deadline_s: int = 6 * 3600
    ttl_s: int = 24 * 3600
    # How long pods may fail to be created or scheduled (quota, admission, no node) before
    # the step fails with the reason, instead of waiting out the deadline.
    start_timeout_s: float = 300.0
    poll_s: float = 10.0
    grace_s: float = 600.0  # beyond the Job's own deadline: API lag, final pod status

    @property
    def url_expiry_s(self) -> int:
        """Pre-signed URLs expire with the step: the Job's deadline plus the launcher's grace
        (signed just before the Job is created); S3 caps them at 7 days. What a tenant writes
        through them after the step ended is refused (:mod:`fedtune.engines.acceptance`)."""
        return int(min(7 * 24 * 3600, self.active_deadline_s + self.grace_s))


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


_SETTINGS_FIELDS = {
    "backoffLimit": "backoff_limit",
    "activeDeadlineSeconds": "active_deadline_s",
    "ttlSecondsAfterFinished": "ttl_s",
    "startTimeoutSeconds": "start_timeout_s",
}


def load_settings(path: str | None = None) -> LauncherSettings:
    """The Job limits in the tenants file's ``launcher`` section (defaults where absent).

    Raises:
        ConfigError: The file cannot be read, or a limit is not a non-negative integer.
    """
    path = path or os.environ.get(TENANTS_FILE_ENV) or DEFAULT_TENANTS_FILE
    try:
        section = json.loads(Path(path).read_text(encoding="utf-8")).get("launcher") or {}
    except (OSError, json.JSONDecodeError, AttributeError) as exc:
        raise ConfigError(
            f"cannot read the tenants file {path!r}: {exc}", fix=_TENANTS_FIX
        ) from None
    values: dict[str, int] = {}
    for key, attr in _SETTINGS_FIELDS.items():
        if key not in section:
            continue
        value = section[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(
                f"launcher.{key} in {path!r} is {value!r}, not a non-negative integer",
                fix="Set tenantDefaults.job in the chart's values to whole seconds / counts.",
            )
        values[attr] = value
    return LauncherSettings(**values)  # type: ignore[arg-type]


def _placement(
    tenant: TenantConfig, deployment: TenantDeployment
) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The pod's nodeSelector and tolerations: the chart's, which the job may only narrow.

    The job config is editable in the KFP run form, so it must not move a tenant's pods onto
    nodes the platform did not give that tenant: it may add nodeSelector keys and pick a
    subset of the chart's tolerations, never override a key or add a toleration.
    """
    res = tenant.resources
    overridden = {
        k: v
        for k, v in res.node_selector.items()
        if k in deployment.node_selector and deployment.node_selector[k] != v
    }
    if overridden:
        raise ConfigError(
            f"tenant {tenant.name!r}: the job overrides nodeSelector {overridden} set by the "
            f"cluster ({deployment.node_selector})",
            fix="Remove those keys from the tenant's resources.node_selector; the platform "
            "sets placement in the chart's tenants[].nodeSelector.",
        )
    added = [t for t in res.tolerations if t not in deployment.tolerations]
    if added:
        raise ConfigError(
            f"tenant {tenant.name!r}: the job adds toleration {added[0]}, which the cluster "
            f"does not grant this tenant ({deployment.tolerations})",
            fix="Remove it from the tenant's resources.tolerations, or ask the platform "
            "engineer to add it to the chart's tenants[].tolerations.",
        )
    tolerations = list(res.tolerations) if res.tolerations else list(deployment.tolerations)
    return {**deployment.node_selector, **res.node_selector}, tolerations


def tenant_secret_env(secret: str) -> list[dict[str, Any]]:
    """The env entries that map the tenant's bucket Secret's keys to boto3's variables."""
    entries = []
    for variable, key, optional in TENANT_SECRET_ENV:
        ref: dict[str, Any] = {"name": secret, "key": key}
        if optional:
            ref["optional"] = True
        entries.append({"name": variable, "valueFrom": {"secretKeyRef": ref}})
    return entries


def job_name(
    job: str, kind: StepKind, round_index: int, tenant: str, run_key: str
) -> tuple[str, str]:
    """A DNS-1123 Job name unique to (job, step, round, tenant, run), and its step id.

    The same inputs always give the same name, so a retried launcher finds its Job; a new
    pipeline run (another ``run_key``) starts a fresh one.
    """
    digest = hashlib.sha256(f"{job}/{kind}/{round_index}/{tenant}/{run_key}".encode())
    step_id = digest.hexdigest()[:10]
    letter = _KIND_LETTERS.get(kind, kind[0])
    return f"{job[:20]}-{letter}{round_index}-{tenant[:20]}-{step_id}", step_id


# One letter per step in Job names; the secure-aggregation steps would all be "s".
_KIND_LETTERS = {"secagg-advertise": "k", "secagg-share": "s", "secagg-unmask": "u"}


# Exit codes a second pod would meet again, so the Job fails at once instead of retrying.
_RETRYABLE: tuple[type[FedtuneError], ...] = (FedtuneError, StoreUnavailable, StopRequested)


def permanent_exit_codes() -> list[int]:
    """The exit codes of the tenant-step errors a retry cannot cure.

    Every fedtune error's but three: the base class (an unexpected crash), a store outage
    (``StoreUnavailable``) and a stop by signal (``StopRequested``: eviction, preemption).
    A bad config, record or checksum fails the same way in every pod; without this rule the
    Job controller would run the step ``backoffLimit`` more times, minutes of GPU time and a
    late answer for nothing.
    """
    return sorted(
        {c.exit_code for c in error_classes().values() if c not in _RETRYABLE}
        - {c.exit_code for c in _RETRYABLE}
    )


def pod_failure_policy(container: str) -> dict[str, Any]:
    """Fail the Job at a permanent error; a disrupted pod (drain, preemption) is not a failure."""
    return {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": container,
                    "operator": "In",
                    "values": permanent_exit_codes(),
                },
            },
            {
                "action": "Ignore",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            },
        ]
    }


def build_job_manifest(
    job: JobConfig,
    tenant_name: str,
    kind: StepKind,
    round_index: int,
    deployment: TenantDeployment,
    *,
    run_key: str = "",
    settings: LauncherSettings = DEFAULT_SETTINGS,
) -> dict[str, Any]:
    """The ``batch/v1`` Job that runs one tenant step in the tenant's namespace.

    It is created suspended: its pre-signed URLs go into a Secret owned by it
    (:func:`build_urls_secret`), which needs the created Job's uid, and the launcher resumes
    it once that Secret exists (see :func:`fedtune.engines.launcher.launch`).
    """
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
    # The tenant's view, built by allowlist (no exchange prefix: the pod has pre-signed URLs).
    visible_job = tenant_view(job, tenant_name).model_dump(mode="json")
    node_selector, tolerations = _placement(tenant, deployment)
    env: list[dict[str, Any]] = [
        {"name": JOB_ENV, "value": json.dumps(visible_job, sort_keys=True)},
        {
            "name": PRESIGNED_ENV,
            "valueFrom": {
                "secretKeyRef": {"name": urls_secret_name(name), "key": URLS_SECRET_KEY}
            },
        },
        *({"name": k, "value": v} for k, v in CACHE_ENV.items()),
        {"name": "HF_HUB_OFFLINE", "value": "1"},
    ]
    if job.engine.step_threads:  # else the pod's threads follow its CPU limit
        env.append({"name": THREADS_ENV, "value": str(job.engine.step_threads)})
    if deployment.bucket_endpoint:
        env.append({"name": "FEDTUNE_S3_ENDPOINT_URL", "value": deployment.bucket_endpoint})
    # The tenant's own bucket credentials, from a Secret the provider never reads.
    env.extend(tenant_secret_env(deployment.bucket_secret))
    container: dict[str, Any] = {
        "name": "tenant-step",
        # The chart's (by digest); else the one the pipeline was compiled with; else the tag.
        "image": deployment.image or os.environ.get(TENANT_IMAGE_ENV) or tenant_image(),
        "command": ["python", "-m", STEP_MODULES[kind]],
        "args": ["--round", str(round_index), "--tenant", tenant_name, "--presigned"],
        "env": env,
        "resources": {"requests": {"cpu": res.cpu, "memory": res.memory}, "limits": limits},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
        },
        "volumeMounts": [{"name": "scratch", "mountPath": SCRATCH}],
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
        "nodeSelector": node_selector,
        "tolerations": tolerations,
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
            "suspend": True,  # until its URL Secret exists; the launcher resumes it
            "backoffLimit": settings.backoff_limit,
            "podFailurePolicy": pod_failure_policy(container["name"]),
            "activeDeadlineSeconds": settings.active_deadline_s,
            "ttlSecondsAfterFinished": settings.ttl_s,
            "template": {
                # Kubeflow profile namespaces inject Istio; a Job pod with a sidecar never ends.
                "metadata": {"labels": labels, "annotations": {"sidecar.istio.io/inject": "false"}},
                "spec": pod_spec,
            },
        },
    }
