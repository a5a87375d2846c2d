"""A scripted stand-in for the Kubernetes API (no API server can run on these machines).

It implements :class:`fedtune.engines.launcher.JobApi`: each ``watch_*`` call moves the
scripted Job to its next state and advances a fake clock by the watch's timeout, so wait-loop
tests take no wall time. A Job created suspended runs only once resumed, and its pod sees
``secretKeyRef`` env of the Secrets created here resolved, as a kubelet would give it. Every call is recorded by method name, which the RBAC test maps to
the permissions the real client needs.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FakeClock:
    """Seconds that pass only when the fake API says so."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def pod(
    name: str,
    *,
    phase: str = "Running",
    created: str = "2026-01-01T00:00:00Z",
    waiting: dict[str, str] | None = None,
    exit_code: int | None = None,
    unschedulable: str | None = None,
    message: str | None = None,
) -> dict[str, Any]:
    """A pod dict as the API returns it (camelCase), with one container state."""
    state: dict[str, Any] = {"running": {}}
    if waiting:
        state = {"waiting": waiting}
    if exit_code is not None:
        state = {"terminated": {"exitCode": exit_code, "reason": "Error"}}
        if message is not None:
            state["terminated"]["message"] = message
    conditions = []
    if unschedulable:
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": unschedulable,
            }
        )
    return {
        "metadata": {"name": name, "creationTimestamp": created},
        "status": {
            "phase": phase,
            "conditions": conditions,
            "containerStatuses": [{"name": "tenant-step", "state": state}],
        },
    }


def job_status(
    condition: str | None = None, reason: str = "", message: str = "", **counts: int
) -> dict[str, Any]:
    """A Job ``status`` with an optional terminal condition (``Complete`` / ``Failed``)."""
    status: dict[str, Any] = dict(counts)
    if condition:
        status["conditions"] = [
            {"type": condition, "status": "True", "reason": reason, "message": message}
        ]
    return status


@dataclass
class State:
    """One scripted moment: the Job's status and its pods."""

    status: dict[str, Any]
    pods: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)  # of the Job (e.g. FailedCreate)


@dataclass
class FakeJobApi:
    """The launcher's view of a cluster, scripted state by state."""

    states: list[State]
    clock: FakeClock = field(default_factory=FakeClock)
    existing: dict[str, Any] | None = None  # a Job an earlier attempt created
    # Runs the created Job (as a kubelet would) and returns the states it goes through.
    on_create: Callable[[dict[str, Any]], list[State]] | None = None
    calls: list[str] = field(default_factory=list)
    created: list[dict[str, Any]] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    secrets: dict[str, dict[str, Any]] = field(default_factory=dict)  # by name, as created
    _index: int = 0
    _body: dict[str, Any] | None = None

    def _current(self) -> State:
        return self.states[min(self._index, len(self.states) - 1)]

    def _advance(self, timeout_s: float) -> None:
        self.clock.now += timeout_s
        self._index += 1

    def create_job(self, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        self.calls.append("create_job")
        if self.existing is not None:
            return None
        self._body = copy.deepcopy(body)
        self._body["metadata"]["uid"] = f"uid-{len(self.created)}"
        self.created.append(self._body)
        if not self._body["spec"].get("suspend"):
            self._run()
        return copy.deepcopy(self._body)

    def resume_job(self, namespace: str, name: str) -> None:
        self.calls.append("resume_job")
        job = self.existing if self.existing is not None else self._body
        assert job is not None and job["metadata"]["name"] == name
        job["spec"]["suspend"] = False
        if job is self._body:
            self._run()

    def create_secret(self, namespace: str, body: dict[str, Any]) -> bool:
        self.calls.append("create_secret")
        name = body["metadata"]["name"]
        if name in self.secrets:
            return False
        self.secrets[name] = copy.deepcopy(body)
        return True

    def _run(self) -> None:
        """The pod of the (running) Job: ``secretKeyRef`` env resolved from the Secrets here."""
        if not self.on_create or self._body is None:
            return
        body = copy.deepcopy(self._body)
        for container in body["spec"]["template"]["spec"]["containers"]:
            for item in container.get("env") or []:
                ref = (item.get("valueFrom") or {}).get("secretKeyRef") or {}
                data = (self.secrets.get(ref.get("name", "")) or {}).get("data") or {}
                if ref.get("key") in data:
                    item.pop("valueFrom")
                    item["value"] = base64.b64decode(data[ref["key"]]).decode()
        self.states = self.on_create(body)

    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append("read_job")
        return self.existing if self.existing is not None else self._body

    def list_job(self, namespace: str, name: str) -> tuple[dict[str, Any] | None, str]:
        self.calls.append("list_job")
        base = self.existing if self.existing is not None else self._body
        if base is None or name in self.deleted:
            return None, "1"
        return {**base, "status": self._current().status}, str(self._index)

    def watch_job(self, namespace: str, name: str, resource_version: str, timeout_s: float) -> None:
        self.calls.append("watch_job")
        self._advance(timeout_s)

    def delete_job(self, namespace: str, name: str) -> None:
        self.calls.append("delete_job")
        self.deleted.append(name)

    def list_pods(self, namespace: str, job_name: str) -> tuple[list[dict[str, Any]], str]:
        self.calls.append("list_pods")
        return copy.deepcopy(self._current().pods), str(self._index)

    def watch_pods(
        self, namespace: str, job_name: str, resource_version: str, timeout_s: float
    ) -> None:
        self.calls.append("watch_pods")
        self._advance(timeout_s)

    def list_job_events(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        self.calls.append("list_job_events")
        return copy.deepcopy(self._current().events)

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append("read_pod")
        return next((p for p in self._current().pods if p["metadata"]["name"] == name), None)

