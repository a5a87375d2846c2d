"""The tenant launcher: run a tenant's step as a ``batch/v1`` Job in the tenant's namespace.

A KFP task always runs in the run's namespace, but a tenant's data and bucket credentials live
in the tenant's own namespace. So the client-step and evaluate components call
:func:`run_tenant_step`: inside a cluster (``$KUBERNETES_SERVICE_HOST`` set) it creates a Job
there — the project image, the tenant's bucket Secret from its own namespace, node selector,
tolerations and GPU limit from the tenant's settings, pre-signed URLs for exactly the objects
the step reads and writes (in a Secret owned by the Job, never in the Job itself) — waits for
it and returns what the step did; outside a cluster it
runs the step in-process. The Job's name is derived from (job, step, round, tenant, KFP run),
so a retried launcher re-attaches to its Job instead of starting a second one.

This is the only module that imports the ``kubernetes`` client, and only inside
:class:`KubernetesJobApi`. Everything else talks to the small :class:`JobApi` protocol, which
is what the tests fake (no API server can run on a development machine).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from fedtune.config.job import JobConfig
from fedtune.config.tenant_view import tenant_view
from fedtune.core.errors import (
    ConfigError,
    FedtuneError,
    StoreError,
    TenantFailure,
    TenantStepFailed,
)
from fedtune.core.messages import Update
from fedtune.engines import acceptance, layout, steps
from fedtune.engines.launcher_manifest import (
    DEFAULT_SETTINGS,
    LauncherSettings,
    build_job_manifest,
    build_urls_secret,
    load_deployment,
    load_settings,
)
from fedtune.engines.tenant.pod_io import SECAGG_OBJECTS, StepKind, presign, step_objects
from fedtune.engines.tenant.tasks import failure_tag, run_tenant_task

log = logging.getLogger(__name__)

IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"
_STUCK = {
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
}
_PERMISSION_FIX = (
    "Install the chart's tenant Role (fedtune.engines.launcher_rbac.LAUNCHER_RULES) in that "
    "namespace and run the pipeline as the launcher ServiceAccount (fedtune submit "
    "--service-account)."
)


# The after-training tenant steps: the key of the result each writes, and its marker field.
_FINAL_RESULTS: dict[str, tuple[Callable[[int], str], str]] = {
    "evaluate": (layout.final_eval_key, "metrics"),
    "audit": (layout.final_audit_key, "scores"),
}


def in_cluster() -> bool:
    """True inside a Kubernetes pod (the kubelet sets ``$KUBERNETES_SERVICE_HOST``)."""
    return bool(os.environ.get(IN_CLUSTER_ENV))


class JobApi(Protocol):
    """The Kubernetes calls the launcher makes; resources are plain camelCase dicts."""

    def create_job(self, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create the Job; the created Job (with its uid), or None when one of that name exists."""
        ...

    def resume_job(self, namespace: str, name: str) -> None:
        """Set the suspended Job's ``spec.suspend`` to false, so its pod is created."""
        ...

    def create_secret(self, namespace: str, body: dict[str, Any]) -> bool:
        """Create the Secret; False when one of that name already exists."""
        ...

    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Job by name, or None."""
        ...

    def list_job(self, namespace: str, name: str) -> tuple[dict[str, Any] | None, str]:
        """The Job (or None) and the list's resourceVersion to watch from."""
        ...

    def watch_job(self, namespace: str, name: str, resource_version: str, timeout_s: float) -> None:
        """Return at the Job's next change, or after ``timeout_s``."""
        ...

    def delete_job(self, namespace: str, name: str) -> None:
        """Delete the Job and its pods (no error if gone)."""
        ...

    def list_pods(self, namespace: str, job_name: str) -> tuple[list[dict[str, Any]], str]:
        """The Job's pods and the list's resourceVersion to watch from."""
        ...

    def watch_pods(
        self, namespace: str, job_name: str, resource_version: str, timeout_s: float
    ) -> None:
        """Return at the next change of one of the Job's pods, or after ``timeout_s``."""
        ...

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod by name, or None."""
        ...

    def list_job_events(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        """The Job's own events (the Job controller reports pods it cannot create there)."""
        ...


@dataclass(frozen=True)
class LaunchOutcome:
    """A finished tenant Job."""

    namespace: str
    name: str
    seconds: float
    reattached: bool


def _conditions(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    status = job.get("status") or {}
    return {c["type"]: c for c in status.get("conditions") or [] if c.get("status") == "True"}


def _exit_code_name(code: int | None) -> str:
    """`` (DataError)`` for a fedtune exit code: says which kind of error ended the pod."""
    pending: list[type[FedtuneError]] = [FedtuneError]
    while pending:
        cls = pending.pop()
        if code == cls.exit_code:
            return f" ({cls.__name__})"
        pending.extend(cls.__subclasses__())
    return ""


def _container_states(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [s.get("state") or {} for s in (pod.get("status") or {}).get("containerStatuses") or []]


def _stuck_reason(pods: list[dict[str, Any]]) -> str | None:
    for pod in pods:
        for state in _container_states(pod):
            waiting = state.get("waiting") or {}
            if waiting.get("reason") in _STUCK:
                return f"pod {pod['metadata']['name']}: {waiting['reason']}: {waiting.get('message', '')}"
    return None


def _pending_reasons(pods: list[dict[str, Any]]) -> str:
    reasons = [
        f"pod {p['metadata']['name']} {c.get('reason', '')}: {c.get('message', '')}"
        for p in pods
        for c in (p.get("status") or {}).get("conditions") or []
        if c.get("type") == "PodScheduled" and c.get("status") == "False"
    ]
    return "; ".join(reasons) or "no pod reported a scheduling problem"


def _blocked_reason(pods: list[dict[str, Any]], events: list[dict[str, Any]]) -> str | None:
    """Why no pod of the Job can start, or None while one runs or may still start.

    Quota, LimitRange and admission (Pod Security, policies, webhooks) refuse the pod itself:
    the Job controller records a ``FailedCreate`` event on the Job and no pod exists. A pod
    that exists but fits on no node has ``PodScheduled=False``, reason ``Unschedulable``.
    """
    if any(_started(p) for p in pods):
        return None
    if pods:
        unschedulable = [
            f"pod {p['metadata']['name']} {c.get('reason', '')}: {c.get('message', '')}"
            for p in pods
            for c in (p.get("status") or {}).get("conditions") or []
            if c.get("type") == "PodScheduled"
            and c.get("status") == "False"
            and c.get("reason") == "Unschedulable"
        ]
        return "; ".join(unschedulable) or None
    refused = [e for e in events if e.get("reason") == "FailedCreate"]
    if not refused:
        return None
    newest = refused[-1]
    return f"FailedCreate: {newest.get('message', '')}"


def _started(pod: dict[str, Any]) -> bool:
    """The pod was placed on a node (it may still be pulling its image) or has ended."""
    status = pod.get("status") or {}
    if status.get("phase") not in (None, "Pending"):
        return True
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _termination_message(pod: dict[str, Any]) -> str | None:
    for state in _container_states(pod):
        terminated = state.get("terminated") or {}
        if terminated.get("message"):
            return str(terminated["message"])
    return None


def _failure(
    api: JobApi,
    namespace: str,
    name: str,
    job: dict[str, Any],
    pods: list[dict[str, Any]],
) -> FedtuneError:
    """Why a tenant Job failed, from Kubernetes status alone (never the pod's log).

    The pod's termination message is parsed strictly into a :class:`TenantFailure` (a known
    error kind and a line number); the tenant reads the full error in its own pod log.
    """
    failed = _conditions(job).get("Failed", {})
    detail = f"{failed.get('reason', 'Failed')}: {failed.get('message', '')}".rstrip(": ")
    newest = sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")
    if not newest:
        return FedtuneError(
            f"Job {namespace}/{name} failed ({detail}) and left no pod to inspect",
            fix=f"Run `kubectl -n {namespace} describe job {name}`.",
        )
    pod_name = newest[-1]["metadata"]["name"]
    pod = api.read_pod(namespace, pod_name) or newest[-1]
    codes = [s["terminated"].get("exitCode") for s in _container_states(pod) if s.get("terminated")]
    code = codes[0] if codes else None
    failure = TenantFailure.parse(_termination_message(pod))
    return TenantStepFailed(
        f"Job {namespace}/{name} failed ({detail}); pod {pod_name} exited with code "
        f"{code}{_exit_code_name(code)}: {failure.render()}",
        failure=failure,
        fix=f"The tenant reads the full error and its fix in its own pod log (`kubectl -n "
        f"{namespace} logs {pod_name}`); after it is corrected, re-run the pipeline (finished "
        "steps are kept).",
    )


def wait_for_job(
    api: JobApi,
    namespace: str,
    name: str,
    *,
    settings: LauncherSettings = DEFAULT_SETTINGS,
    clock: Callable[[], float] = time.monotonic,
) -> float:
    """Wait for the Job to succeed; return the seconds waited.

    Raises:
        FedtuneError: The Job failed (with the redacted failure its pod left), a pod cannot start (bad image,
            missing Secret), no pod could be created or scheduled for ``start_timeout_s``
            (quota, admission, no fitting node), the Job vanished, or it did not finish in
            time (in the last three cases the Job is deleted).
    """
    started = clock()
    deadline = started + settings.active_deadline_s + settings.grace_s
    blocked_since: float | None = None
    while True:
        job, job_version = api.list_job(namespace, name)
        if job is None:
            raise FedtuneError(
                f"Job {namespace}/{name} disappeared while the launcher waited for it",
                fix="Someone deleted it, or its TTL passed; re-run the pipeline.",
            )
        done = _conditions(job)
        if "Complete" in done or (job.get("status") or {}).get("succeeded"):
            return clock() - started
        pods, pod_version = api.list_pods(namespace, name)
        if "Failed" in done:
            raise _failure(api, namespace, name, job, pods)
        stuck = _stuck_reason(pods)
        if stuck:
            api.delete_job(namespace, name)
            raise FedtuneError(
                f"Job {namespace}/{name} cannot start: {stuck}",
                fix="Check the image name and that the tenant's bucket Secret exists "
                f"in namespace {namespace}; the Job was deleted.",
            )
        now = clock()
        blocked = _blocked_reason(pods, api.list_job_events(namespace, name) if not pods else [])
        blocked_since = None if blocked is None else (now if blocked_since is None else blocked_since)
        if blocked is not None and blocked_since is not None:
            if now - blocked_since >= settings.start_timeout_s:
                api.delete_job(namespace, name)
                raise FedtuneError(
                    f"Job {namespace}/{name} could not start its pod for "
                    f"{settings.start_timeout_s:.0f} s: {blocked}; it was deleted",
                    fix=f"Check the tenant's quota, LimitRange and admission policies and the "
                    f"nodes its selector allows (`kubectl -n {namespace} describe job {name}`), "
                    "or raise tenantDefaults.job.startTimeoutSeconds in the chart.",
                )
            deadline_wait = blocked_since + settings.start_timeout_s - now
        else:
            deadline_wait = float("inf")
        if now >= deadline:
            api.delete_job(namespace, name)
            raise FedtuneError(
                f"Job {namespace}/{name} did not finish within {deadline - started:.0f} s "
                f"({_pending_reasons(pods)}); it was deleted",
                fix=f"Check the tenant's quota, node selector and GPUs (`kubectl -n {namespace} "
                "describe pods`), or raise the launcher's deadline.",
            )
        timeout = min(settings.poll_s, deadline - now, deadline_wait)
        # Pods carry the fine-grained changes (container states); without pods, the Job does.
        if pods:
            api.watch_pods(namespace, name, pod_version, timeout)
        else:
            api.watch_job(namespace, name, job_version, timeout)


def _hand_over_urls(
    api: JobApi, job: dict[str, Any], urls: dict[str, dict[str, str]], *, fresh: bool
) -> None:
    """Create the suspended Job's URL Secret, owned by it, then resume the Job.

    A re-attached Job still suspended was left by an attempt that stopped in between: its
    Secret may exist already, which is fine. For a Job just created, an existing Secret of
    that name is not the launcher's (it cannot read it to check): the Job is deleted.
    """
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    secret = build_urls_secret(job, urls)
    if not api.create_secret(namespace, secret) and fresh:
        api.delete_job(namespace, name)
        secret_name = secret["metadata"]["name"]
        raise ConfigError(
            f"a Secret {namespace}/{secret_name} exists already, so the launcher cannot hand "
            f"Job {name} its pre-signed URLs; the Job was deleted",
            fix=f"Delete that Secret (`kubectl -n {namespace} delete secret {secret_name}`) "
            "and re-run the pipeline: a Job's URL Secret is created with it and deleted with it.",
        )
    api.resume_job(namespace, name)


def launch(
    api: JobApi,
    manifest: dict[str, Any],
    urls: dict[str, dict[str, str]],
    *,
    settings: LauncherSettings = DEFAULT_SETTINGS,
    clock: Callable[[], float] = time.monotonic,
) -> LaunchOutcome:
    """Create the Job (or re-attach to the one a previous attempt created), hand it its
    pre-signed URLs and wait for it.

    The URLs must not sit in the Job: whoever may ``get jobs`` or ``get pods`` in the tenant's
    namespace would read them. They go into a Secret that the Job owns, so that the garbage
    collector deletes it with the Job, and an ownerReference needs the Job's uid. So the Job is
    created suspended, its Secret is created owned by it, and then the Job is resumed
    (``jobs: patch``). The other order (Secret first, ownerReference patched in afterwards)
    would need ``secrets: patch``, which would let the launcher change every Secret of the
    tenant, its bucket credentials included; this way it only ever creates Secrets and never
    reads one.
    """
    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    created = api.create_job(namespace, manifest)
    reattached = created is None
    job = created
    if created is None:
        existing = job = api.read_job(namespace, name) or {}
        want = manifest["metadata"]["labels"]["fedtune.io/step-id"]
        have = ((existing.get("metadata") or {}).get("labels") or {}).get("fedtune.io/step-id")
        if have != want:
            raise ConfigError(
                f"a Job named {namespace}/{name} exists but belongs to another step "
                f"(step id {have!r}, expected {want!r})",
                fix=f"Delete it: `kubectl -n {namespace} delete job {name}`.",
            )
        log.info("re-attaching to Job %s/%s started by an earlier attempt", namespace, name)
    else:
        log.info("created Job %s/%s", namespace, name)
    if job and (job.get("spec") or {}).get("suspend"):
        _hand_over_urls(api, job, urls, fresh=created is not None)
    seconds = wait_for_job(api, namespace, name, settings=settings, clock=clock)
    return LaunchOutcome(namespace=namespace, name=name, seconds=seconds, reattached=reattached)


def run_tenant_step(
    job: JobConfig,
    kind: StepKind,
    round_index: int,
    tenant: str,
    *,
    run_key: str = "",
    api: JobApi | None = None,
    settings: LauncherSettings | None = None,
    tenants_file: str | None = None,
    force_cluster: bool = False,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Run a tenant's step: as a Job in its namespace in a cluster, else in-process.

    Returns the step's result: for ``client`` the shape of
    :func:`fedtune.engines.steps.client_step`, for ``evaluate`` ``{"metrics": {...}}``, for
    ``audit`` ``{"scores": {...}}``, for a secure-aggregation step the bytes it wrote. ``settings`` defaults to the Job limits of the tenants
    file (the chart's ``tenantDefaults.job``).
    """
    config = next((t for t in job.tenants if t.name == tenant), None)
    if config is None:
        raise ConfigError(f"no tenant named {tenant!r} in job {job.name!r}")
    if kind in _FINAL_RESULTS and not steps.final_broadcast_published(job, tenant):
        # Published once by the provider's own final-broadcast step: a tenant step only reads.
        raise StoreError(
            f"the final broadcast of job {job.name!r} is not in tenant {tenant!r}'s exchange "
            f"prefix, so its {kind} step has nothing to read",
            fix="Run the provider's final-broadcast step first (`python -m "
            "fedtune.entrypoints.final_broadcast --job JOB.yaml`; pipelines run it before the "
            "evaluate tasks).",
        )
    if not (force_cluster or in_cluster()):
        return _run_in_process(job, kind, round_index, tenant)
    stores = layout.JobStores(job)
    store = stores.exchange(tenant)
    gets, puts = step_objects(kind, tenant_view(job, tenant), round_index)

    def accepted(result: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        # Recorded before they are read: from here on, an overwrite through a URL is refused.
        acceptance.accept(stores.provider(), store, tenant, puts)
        return result()

    def final_result(key: str) -> Any:
        # Metrics and audit scores go on to the provider's tasks from here: read as accepted.
        data = acceptance.verify(stores.provider(), store, tenant, key)
        return json.loads(data) if data is not None else store.get_json(key)

    update = layout.update_key(round_index)
    if kind == "client" and Update.stored(store, update):
        return accepted(lambda: {**steps.stored_update_result(store, update), "skipped": True})
    final_key = _FINAL_RESULTS.get(kind)
    if final_key is not None and store.exists(final_key[0](job.rounds)):
        return accepted(lambda: {final_key[1]: final_result(final_key[0](job.rounds)), "skipped": True})
    written = _secagg_written(kind, round_index)
    if written is not None and store.exists(written):
        return accepted(lambda: {"skipped": True, "bytes": len(store.get_bytes(written))})
    deployment = load_deployment(config, tenants_file)
    settings = settings or load_settings(tenants_file)  # the chart's tenantDefaults.job
    urls = presign(store, gets, puts, settings.url_expiry_s)
    step_round = job.rounds if kind in _FINAL_RESULTS else round_index
    manifest = build_job_manifest(
        job, tenant, kind, step_round, deployment, run_key=run_key, settings=settings
    )
    outcome = launch(api or KubernetesJobApi(), manifest, urls, settings=settings, clock=clock)
    where = {"seconds": outcome.seconds, "k8s_job": f"{outcome.namespace}/{outcome.name}"}
    if final_key is not None:
        return accepted(lambda: {final_key[1]: final_result(final_key[0](job.rounds)), **where})
    if written is not None:
        if not store.exists(written):
            raise FedtuneError(
                f"Job {where['k8s_job']} succeeded but tenant {tenant!r} stored no {written}",
                fix="Check the tenant pod's log for failed uploads (expired URLs?).",
            )
        return accepted(lambda: {"bytes": len(store.get_bytes(written)), **where})
    if not Update.stored(store, update):
        raise FedtuneError(
            f"Job {where['k8s_job']} succeeded but no update of tenant {tenant!r} is stored",
            fix="Check the tenant pod's log for failed uploads (expired URLs?).",
        )
    return accepted(lambda: {**steps.stored_update_result(store, update), **where})


def _secagg_written(kind: StepKind, round_index: int) -> str | None:
    """The message a secure-aggregation tenant step writes (None for the other steps)."""
    if kind not in SECAGG_OBJECTS:
        return None
    return layout.secagg_key(round_index, SECAGG_OBJECTS[kind][1])


def _run_in_process(job: JobConfig, kind: StepKind, round_index: int, tenant: str) -> dict[str, Any]:
    """The tenant's step in this process (outside a cluster), failing as a pod would.

    The full error goes to the tenant's own store; what propagates (to the KFP task's log and
    markers) is the redacted failure, as from a launched pod.
    """
    env = steps.TenantEnv.create(job, tenant)
    try:
        return run_tenant_task(env, kind, round_index)
    except FedtuneError as exc:
        where = steps.keep_failure_details(env, failure_tag(kind, round_index), exc)
        failure = exc.redacted()
        raise TenantStepFailed(
            f"the {kind} step of tenant {tenant!r} failed: {failure.render()}",
            failure=failure,
            fix=f"The tenant reads the full error and its fix in {where}.",
        ) from None


class KubernetesJobApi:
    """:class:`JobApi` over the official client, with in-cluster credentials."""

    #: The RBAC permission (apiGroup, resource, verb) behind each method; see LAUNCHER_RULES.
    PERMISSIONS: ClassVar[dict[str, tuple[str, str, str]]] = {
        "create_job": ("batch", "jobs", "create"),
        "resume_job": ("batch", "jobs", "patch"),
        "create_secret": ("", "secrets", "create"),
        "read_job": ("batch", "jobs", "get"),
        "list_job": ("batch", "jobs", "list"),
        "watch_job": ("batch", "jobs", "watch"),
        "delete_job": ("batch", "jobs", "delete"),
        "list_pods": ("", "pods", "list"),
        "watch_pods": ("", "pods", "watch"),
        "read_pod": ("", "pods", "get"),
        "list_job_events": ("", "events", "list"),
    }

    def __init__(self) -> None:
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException

        try:
            config.load_incluster_config()
        except ConfigException as exc:
            raise ConfigError(
                f"no in-cluster Kubernetes credentials: {exc}",
                fix="Run the launcher inside a pod with a ServiceAccount token.",
            ) from None
        self._batch = client.BatchV1Api()
        self._core = client.CoreV1Api()
        self._plain = client.ApiClient().sanitize_for_serialization

    @contextmanager
    def _errors(self, action: str, namespace: str, missing_ok: bool = False) -> Iterator[None]:
        from kubernetes.client.exceptions import ApiException

        try:
            yield
        except ApiException as exc:
            if exc.status == 403:
                raise ConfigError(
                    f"the launcher may not {action} in namespace {namespace!r}: {exc.reason}",
                    fix=_PERMISSION_FIX,
                ) from None
            if not (missing_ok and exc.status == 404):
                raise  # transient (5xx, timeouts): the KFP retry re-attaches

    def create_job(self, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            with self._errors("create jobs", namespace):
                created = self._batch.create_namespaced_job(namespace, body)
        except ApiException as exc:
            if exc.status == 409:
                return None
            raise
        return dict(self._plain(created))

    def resume_job(self, namespace: str, name: str) -> None:
        with self._errors("patch jobs", namespace):
            self._batch.patch_namespaced_job(name, namespace, {"spec": {"suspend": False}})

    def create_secret(self, namespace: str, body: dict[str, Any]) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            with self._errors("create secrets", namespace):
                self._core.create_namespaced_secret(namespace, body)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._errors("get jobs", namespace, missing_ok=True):
            return dict(self._plain(self._batch.read_namespaced_job(name, namespace)))
        return None

    def list_job(self, namespace: str, name: str) -> tuple[dict[str, Any] | None, str]:
        with self._errors("list jobs", namespace):
            found = self._plain(
                self._batch.list_namespaced_job(namespace, field_selector=f"metadata.name={name}")
            )
        items = found.get("items") or []
        return (items[0] if items else None), found["metadata"].get("resourceVersion", "")

    def _watch(
        self, func: Any, namespace: str, resource_version: str, timeout_s: float, **selector: str
    ) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        stream = watch.Watch()
        try:
            for _ in stream.stream(
                func,
                namespace,
                resource_version=resource_version,
                timeout_seconds=max(1, int(timeout_s)),
                **selector,
            ):
                break  # any change: the loop re-reads the state
        except ApiException as exc:
            if exc.status != 410:  # 410: version too old; the next list starts afresh
                raise
        finally:
            stream.stop()

    def watch_job(self, namespace: str, name: str, resource_version: str, timeout_s: float) -> None:
        with self._errors("watch jobs", namespace):
            self._watch(
                self._batch.list_namespaced_job,
                namespace,
                resource_version,
                timeout_s,
                field_selector=f"metadata.name={name}",
            )

    def delete_job(self, namespace: str, name: str) -> None:
        with self._errors("delete jobs", namespace, missing_ok=True):
            self._batch.delete_namespaced_job(name, namespace, propagation_policy="Background")

    def list_pods(self, namespace: str, job_name: str) -> tuple[list[dict[str, Any]], str]:
        with self._errors("list pods", namespace):
            found = self._plain(
                self._core.list_namespaced_pod(namespace, label_selector=f"job-name={job_name}")
            )
        return list(found.get("items") or []), found["metadata"].get("resourceVersion", "")

    def watch_pods(
        self, namespace: str, job_name: str, resource_version: str, timeout_s: float
    ) -> None:
        with self._errors("watch pods", namespace):
            self._watch(
                self._core.list_namespaced_pod,
                namespace,
                resource_version,
                timeout_s,
                label_selector=f"job-name={job_name}",
            )

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._errors("get pods", namespace, missing_ok=True):
            return dict(self._plain(self._core.read_namespaced_pod(name, namespace)))
        return None

    def list_job_events(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        with self._errors("list events", namespace):
            found = self._plain(
                self._core.list_namespaced_event(
                    namespace,
                    field_selector=f"involvedObject.kind=Job,involvedObject.name={job_name}",
                )
            )
        items = list(found.get("items") or [])
        # Oldest first, so the last one is the controller's latest word.
        return sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")

