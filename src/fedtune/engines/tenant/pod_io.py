"""A launched tenant pod's side of the exchange: exactly its objects, by pre-signed URL.

On Kubernetes the provider's launcher never hands a tenant pod the exchange store's
credentials. It pre-signs a GET URL for each object the step reads (the round's broadcast, or
the final broadcast for evaluation) and a PUT URL for each object it writes (the tenant's
update, or its metrics or audit scores), all inside that tenant's exchange prefix and for that one round, and
passes them in ``$FEDTUNE_PRESIGNED``, which the pod's spec maps from the Job's own Secret
(never a plain value in the Job). The pod mirrors what it reads into
a private local exchange store, runs the very same step function, then uploads what the step
wrote, checksum sidecars included, the JSON half of a message last (its presence marks the
message complete). URLs are capabilities: they are never logged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from http import HTTPStatus
from typing import Any

from fedtune.config.job import LimitsConfig
from fedtune.config.tenant_view import TenantJob
from fedtune.core.errors import ConfigError, IntegrityError, StoreError, StoreUnavailable
from fedtune.core.http_retry import MaxRetryError, RetryingClient, without_query
from fedtune.engines import layout
from fedtune.engines.tenant.env import TenantEnv
from fedtune.engines.tenant.tasks import TenantKind, run_tenant_task
from fedtune.storage.base import Store

log = logging.getLogger(__name__)

JOB_ENV = "FEDTUNE_JOB_JSON"
"""Environment variable holding the job as JSON (how a launched tenant pod gets its view)."""

PRESIGNED_ENV = "FEDTUNE_PRESIGNED"
"""Environment variable with ``{"get": {key: url}, "put": {key: url}}`` for a tenant pod."""

StepKind = TenantKind
SIDECAR = ".sha256"


def _message_blobs(key: str) -> list[str]:
    # Tensors first, JSON last: a reader treats the JSON as the mark of a complete message.
    return [f"{key}.safetensors", f"{key}.json"]


SECAGG_OBJECTS: dict[str, tuple[tuple[str, ...], str]] = {
    "secagg-advertise": ((), "advert"),
    "secagg-share": (("roster",), "dealt"),
    "secagg-unmask": (("unmask-request", "roster"), "unmask"),
}
"""The secure-aggregation messages each extra tenant step reads, and the one it writes."""


def step_objects(
    kind: StepKind, view: TenantJob, round_index: int
) -> tuple[list[str], list[str]]:
    """The blobs a tenant step reads and writes, as keys inside the tenant's exchange prefix
    (sidecars implied); ``view`` is the tenant's view of the job."""
    if kind in SECAGG_OBJECTS:
        reads, writes = SECAGG_OBJECTS[kind]
        return (
            [layout.secagg_key(round_index, name) for name in reads],
            [layout.secagg_key(round_index, writes)],
        )
    if kind == "client":
        gets = _message_blobs(layout.round_broadcast_key(round_index))
        if view.secure_aggregation is not None:  # the routed roster and its own sealed shares
            gets += [layout.secagg_key(round_index, n) for n in ("roster", "inbox")]
        if view.client_level_dp:  # the round's clip norm and noise share
            gets.append(layout.privacy_plan_key(round_index))
        return gets, _message_blobs(layout.update_key(round_index))
    result = layout.final_audit_key if kind == "audit" else layout.final_eval_key
    return (
        _message_blobs(layout.final_tenant_broadcast_key(view.rounds)),
        [result(view.rounds)],
    )


def presign(
    store: Store, gets: list[str], puts: list[str], expires_s: int
) -> dict[str, dict[str, str]]:
    """GET URLs for ``gets`` and PUT URLs for ``puts``, each blob with its sidecar.

    ``store`` is the tenant's exchange prefix, so every URL is confined to it.
    """
    return {
        "get": {
            k: store.presigned_url(k, method="get", expires_s=expires_s)
            for k in _with_sidecars(gets)
        },
        "put": {
            k: store.presigned_url(k, method="put", expires_s=expires_s)
            for k in _with_sidecars(puts)
        },
    }


def _with_sidecars(keys: list[str]) -> list[str]:
    return [name for key in keys for name in (key, key + SIDECAR)]


def _request(
    url: str, key: str, method: str, limits: LimitsConfig, data: bytes | None = None
) -> bytes:
    """One HTTP request, retried on network errors and 5xx within the job's ``limits``
    (``store_*``, as for the S3 client); the URL is not logged."""
    attempts = limits.store_max_attempts
    client = RetryingClient(
        attempts=attempts,
        backoff_s=0.5,  # urllib3: retries after 0, 1, 2, 4 ... s
        connect_timeout_s=limits.store_connect_timeout_s,
        read_timeout_s=limits.store_read_timeout_s,
        retry_statuses=range(500, 600),
    )
    # An explicit binary type: a body without one may be parsed as a form.
    headers = {"Content-Type": "application/octet-stream"} if data is not None else {}
    try:
        answer = client.send(method, url, label=f"{method} of {key}", body=data, headers=headers)
    except MaxRetryError as exc:
        raise StoreUnavailable(
            f"store outage: {method} of exchange object {key!r} by pre-signed URL failed: "
            f"{without_query(str(exc.reason or 'no answer'))} ({attempts} attempt(s))",
            fix="Check that the tenant namespace's network policy allows egress to the "
            "provider's object store endpoint.",
        ) from None
    if answer.status >= 300:
        raise StoreError(
            f"{method} of exchange object {key!r} by pre-signed URL failed: "
            f"HTTP {answer.status} {_phrase(answer.status)}".rstrip(),
            fix="403 usually means the URL expired (raise the launcher's deadline) or "
            "the clock is off; 404 means the provider has not written the object.",
        )
    return answer.body


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def read_urls(expected: tuple[list[str], list[str]]) -> dict[str, dict[str, str]]:
    """Read ``$FEDTUNE_PRESIGNED`` and check it names exactly the expected objects."""
    raw = os.environ.get(PRESIGNED_ENV)
    if not raw:
        raise ConfigError(
            f"--presigned given but ${PRESIGNED_ENV} is empty",
            fix="Tenant pods are started by the provider's launcher, which sets it.",
        )
    try:
        urls = json.loads(raw)
        got = {"get": set(urls["get"]), "put": set(urls["put"])}
    except (json.JSONDecodeError, KeyError, TypeError):
        raise ConfigError(
            f"${PRESIGNED_ENV} is not a JSON object with 'get' and 'put' maps",
            fix="Tenant pods are started by the provider's launcher, which sets it.",
        ) from None
    want = {"get": set(_with_sidecars(expected[0])), "put": set(_with_sidecars(expected[1]))}
    if got != want:
        raise ConfigError(
            f"${PRESIGNED_ENV} names {sorted(got['get'])} / {sorted(got['put'])}, but this "
            f"step reads {sorted(want['get'])} and writes {sorted(want['put'])}",
            fix="Launcher and tenant image must be the same fedtune version.",
        )
    return {"get": dict(urls["get"]), "put": dict(urls["put"])}


def run_presigned(
    view: TenantJob, kind: StepKind, round_index: int, urls: dict[str, dict[str, str]]
) -> dict[str, Any]:
    """Fetch the step's inputs, run it against a private local exchange, upload its outputs;
    ``view`` is the tenant's view of the job (all a launched pod is given)."""
    from fedtune.storage import open_store

    gets, puts = step_objects(kind, view, round_index)
    limits = view.limits
    with tempfile.TemporaryDirectory(prefix="fedtune-exchange-") as tmp:
        store = open_store(tmp)
        env = TenantEnv.create(view, exchange=store)
        for key in gets:
            data = _request(urls["get"][key], key, "GET", limits)
            recorded = (
                _request(urls["get"][key + SIDECAR], key + SIDECAR, "GET", limits)
                .decode()
                .strip()
            )
            if hashlib.sha256(data).hexdigest() != recorded:
                raise IntegrityError(
                    f"exchange object {key!r} does not match its sha256 sidecar ({recorded[:64]!r})"
                )
            store.put_bytes(key, data)
        result = run_tenant_task(env, kind, round_index)
        for key in puts:
            data = store.get_bytes(key)
            _request(urls["put"][key], key, "PUT", limits, data)
            _request(
                urls["put"][key + SIDECAR],
                key + SIDECAR,
                "PUT",
                limits,
                hashlib.sha256(data).hexdigest().encode(),
            )
            log.info("uploaded %s (%d bytes)", key, len(data))
    return result
