"""A stand-in kubelet for tests: pods bound to the fake Node run as local processes.

What it gives a container, as a kubelet would: its command and args (an image's ``python`` is
this interpreter), its environment (plain values, ``secretKeyRef``, ``configMapKeyRef``,
``fieldRef``, ``envFrom``, and the ``KUBERNETES_SERVICE_*`` variables every pod gets), and its
volumes (Secret, ConfigMap, emptyDir, projected service-account tokens) as files in a folder of
its own, with every mount path in its env, args and working dir rewritten to that folder. What
it writes back: the pod's phase, its container states, exit codes and termination messages.
What it cannot do: images, users, resource limits, network isolation (docs/cluster-testing.md).

The one fedtune-specific line: a kubelet mounts a file at ``terminationMessagePath``; a local
process cannot be given that path, so fedtune's entrypoints are told where it is through their
own variable ``FEDTUNE_TERMINATION_LOG``.
"""

from __future__ import annotations

import base64
import datetime
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TERMINATION_ENV = "FEDTUNE_TERMINATION_LOG"
PYTHONS = {"python", "python3", "/usr/bin/python", "/usr/bin/python3", "/usr/local/bin/python"}
MESSAGE_LIMIT = 4096  # the kubelet's limit on a termination message


class PodSetupError(Exception):
    """The kubelet would not start the container (``CreateContainerConfigError``)."""


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class RunRecord:
    """One container run: what a test may assert about it."""

    namespace: str
    pod: str
    container: str
    argv: list[str]
    env: dict[str, str]
    exit_code: int
    message: str
    seconds: float
    log: Path

    def output(self) -> str:
        """What the container printed (``kubectl logs``)."""
        return self.log.read_text(errors="replace")


@dataclass
class PodRunner:
    """Runs the pods bound to ``node`` until :meth:`stop`.

    ``base_env`` is what the image would provide (PATH, PYTHONPATH to the code under test,
    thread limits); nothing else of this process's environment reaches a pod.
    """

    core: Any  # kubernetes.client.CoreV1Api, admin
    node: str
    workdir: Path
    server_host: str
    server_port: int
    base_env: dict[str, str] = field(default_factory=dict)
    poll_s: float = 0.25
    records: list[RunRecord] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _seen: set[str] = field(default_factory=set)
    _procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> PodRunner:
        self._thread = threading.Thread(target=self._loop, name="pod-runner", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)
        with self._lock:
            procs = list(self._procs.values())
        for proc in procs:
            proc.kill()

    # -- the loop ------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                pods = self.core.list_pod_for_all_namespaces(
                    field_selector=f"spec.nodeName={self.node}"
                ).items
                for pod in pods:
                    self._handle(pod)
            except Exception as exc:  # keep running; a test reads the errors
                if not self._stop.is_set():
                    self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(self.poll_s)

    def _handle(self, pod: Any) -> None:
        uid = pod.metadata.uid
        if pod.metadata.deletion_timestamp is not None:
            # As a kubelet: stop the containers, then remove the pod for good.
            with self._lock:
                proc = self._procs.get(uid)
            if proc is not None:
                proc.kill()
                return
            self._forget(pod)
            return
        if uid in self._seen or pod.status.phase not in (None, "Pending"):
            return
        self._seen.add(uid)
        threading.Thread(target=self._run_pod, args=(pod,), daemon=True).start()

    def _forget(self, pod: Any) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.delete_namespaced_pod(
                pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
        shutil.rmtree(self.workdir / pod.metadata.uid, ignore_errors=True)

    # -- one pod -------------------------------------------------------------------------

    def _run_pod(self, pod: Any) -> None:
        ns, name = pod.metadata.namespace, pod.metadata.name
        folder = self.workdir / pod.metadata.uid
        folder.mkdir(parents=True, exist_ok=True)
        containers = [*(pod.spec.init_containers or []), *pod.spec.containers]
        try:  # everything a container needs, before any starts (as a kubelet)
            mounts = self._volumes(pod, folder / "volumes")
            prepared = [self._prepare(pod, c, folder, mounts) for c in containers]
        except PodSetupError as exc:
            self._not_yet(pod, str(exc))
            return
        started = _now()
        self._patch(ns, name, {"status": {
            "phase": "Running", "startTime": started, "hostIP": "127.0.0.1", "podIP": "127.0.0.1",
            "containerStatuses": [self._status(c.name, {"running": {"startedAt": started}})
                                  for c in pod.spec.containers]}})
        states, ok = [], True
        for container, launch in zip(containers, prepared, strict=True):
            if not ok:
                break
            code, message = self._run_container(pod, container, folder, *launch)
            ok = code == 0
            if container in pod.spec.containers:
                states.append(self._status(container.name, {"terminated": {
                    "exitCode": code, "reason": "Completed" if ok else "Error",
                    "message": message or None, "startedAt": started, "finishedAt": _now()}}))
        self._patch(ns, name, {"status": {
            "phase": "Succeeded" if ok else "Failed", "containerStatuses": states}})

    def _not_yet(self, pod: Any, message: str) -> None:
        """Report the container waiting, and try again later, as a kubelet does (the missing
        Secret may yet be created)."""
        self._waiting(pod, "CreateContainerConfigError", message)
        self._stop.wait(1.0)
        self._seen.discard(pod.metadata.uid)

    def _status(self, name: str, state: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "state": state, "ready": False, "restartCount": 0,
                "image": "", "imageID": "", "started": "running" in state}

    def _waiting(self, pod: Any, reason: str, message: str) -> None:
        self._patch(pod.metadata.namespace, pod.metadata.name, {"status": {
            "containerStatuses": [self._status(c.name, {"waiting": {
                "reason": reason, "message": message}}) for c in pod.spec.containers]}})

    def _patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.patch_namespaced_pod_status(name, namespace, body)
        except ApiException as exc:
            if exc.status != 404:  # deleted while running: nothing to report to
                raise

    def _prepare(
        self, pod: Any, container: Any, folder: Path, volumes: dict[str, Path]
    ) -> tuple[list[str], dict[str, str], Path, Path]:
        """The container's argv, env, working dir and termination-message file, with every
        mount path rewritten to its local folder."""
        rewrites: list[tuple[str, str]] = []
        for mount in container.volume_mounts or []:
            local = volumes[mount.name] / (mount.sub_path or "")
            rewrites.append((mount.mount_path.rstrip("/"), str(local)))
        message_file = folder / f"termination-{container.name}"
        if container.termination_message_path:
            rewrites.append((container.termination_message_path, str(message_file)))
        rewrites.sort(key=lambda r: -len(r[0]))  # the longest (most specific) prefix first

        def local(value: str) -> str:
            for prefix, target in rewrites:
                if value == prefix or value.startswith(prefix + "/"):
                    return target + value[len(prefix):]
            return value

        if not container.command:
            raise PodSetupError(
                f"container {container.name!r} has no command: the pod runner cannot read an "
                "image's entrypoint"
            )
        argv = [local(a) for a in [*container.command, *(container.args or [])]]
        if argv[0] in PYTHONS:
            argv[0] = sys.executable
        env = {**self.base_env, **self._env(pod, container)}
        env = {k: local(v) for k, v in env.items()}
        env[TERMINATION_ENV] = str(message_file)
        cwd = Path(local(container.working_dir)) if container.working_dir else folder
        return argv, env, cwd, message_file

    def _run_container(
        self, pod: Any, container: Any, folder: Path,
        argv: list[str], env: dict[str, str], cwd: Path, message_file: Path,
    ) -> tuple[int, str]:
        cwd.mkdir(parents=True, exist_ok=True)
        log_path = folder / f"{container.name}.log"
        log = open(log_path, "wb")  # noqa: SIM115 - closed below
        began = time.monotonic()
        try:
            proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
            with self._lock:
                self._procs[pod.metadata.uid] = proc
            code = proc.wait()
        finally:
            log.close()
            with self._lock:
                self._procs.pop(pod.metadata.uid, None)
        message = ""
        if message_file.exists():
            message = message_file.read_text(errors="replace")[:MESSAGE_LIMIT]
        self.records.append(RunRecord(pod.metadata.namespace, pod.metadata.name, container.name,
                                      argv, env, code, message, time.monotonic() - began,
                                      log_path))
        return code, message

    # -- what a kubelet resolves ---------------------------------------------------------

    def _data(
        self, kind: str, namespace: str, name: str, optional: bool
    ) -> dict[str, bytes] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            if kind == "secret":
                obj = self.core.read_namespaced_secret(name, namespace)
                return {k: base64.b64decode(v) for k, v in (obj.data or {}).items()}
            obj = self.core.read_namespaced_config_map(name, namespace)
            return {k: v.encode() for k, v in (obj.data or {}).items()}
        except ApiException as exc:
            if exc.status == 404 and optional:
                return None
            if exc.status == 404:
                raise PodSetupError(f'{kind} "{name}" not found') from None
            raise

    def _env(self, pod: Any, container: Any) -> dict[str, str]:
        ns = pod.metadata.namespace
        env = {
            "HOSTNAME": pod.metadata.name,
            "KUBERNETES_SERVICE_HOST": self.server_host,
            "KUBERNETES_SERVICE_PORT": str(self.server_port),
        }
        for source in container.env_from or []:
            ref, kind = (source.secret_ref, "secret") if source.secret_ref else (
                source.config_map_ref, "configmap")
            data = self._data(kind, ns, ref.name, bool(ref.optional)) or {}
            env.update({(source.prefix or "") + k: v.decode() for k, v in data.items()})
        for item in container.env or []:
            if item.value_from is None:
                env[item.name] = item.value or ""
                continue
            value = self._env_value(pod, item.value_from)
            if value is not None:
                env[item.name] = value
        return env

    def _env_value(self, pod: Any, source: Any) -> str | None:
        ns = pod.metadata.namespace
        refs = ((source.secret_key_ref, "secret"), (source.config_map_key_ref, "configmap"))
        for ref, kind in refs:
            if ref is None:
                continue
            data = self._data(kind, ns, ref.name, bool(ref.optional))
            if data is None or ref.key not in data:
                if ref.optional:
                    return None
                raise PodSetupError(f"couldn't find key {ref.key} in {kind} {ns}/{ref.name}")
            return data[ref.key].decode()
        if source.field_ref is not None:
            fields = {"metadata.name": pod.metadata.name, "metadata.namespace": ns,
                      "metadata.uid": pod.metadata.uid, "spec.nodeName": pod.spec.node_name,
                      "spec.serviceAccountName": pod.spec.service_account_name,
                      "status.podIP": "127.0.0.1", "status.hostIP": "127.0.0.1"}
            return fields.get(source.field_ref.field_path, "")
        raise PodSetupError(f"the pod runner cannot resolve env source {source}")

    def _volumes(self, pod: Any, root: Path) -> dict[str, Path]:
        folders: dict[str, Path] = {}
        for volume in pod.spec.volumes or []:
            folder = root / volume.name
            folder.mkdir(parents=True, exist_ok=True)
            folders[volume.name] = folder
            if volume.secret is not None:
                self._files(folder, self._data("secret", pod.metadata.namespace,
                                               volume.secret.secret_name,
                                               bool(volume.secret.optional)), volume.secret.items)
            elif volume.config_map is not None:
                self._files(folder, self._data("configmap", pod.metadata.namespace,
                                               volume.config_map.name,
                                               bool(volume.config_map.optional)),
                            volume.config_map.items)
            elif volume.projected is not None:
                self._projected(pod, folder, volume.projected)
            elif volume.empty_dir is None:
                raise PodSetupError(f"volume {volume.name!r}: the pod runner supports Secret, "
                                    "ConfigMap, projected and emptyDir volumes only")
        return folders

    @staticmethod
    def _files(folder: Path, data: dict[str, bytes] | None, items: Any) -> None:
        for key, value in (data or {}).items():
            paths = [i.path for i in items or [] if i.key == key] if items else [key]
            for path in paths:
                (folder / path).parent.mkdir(parents=True, exist_ok=True)
                (folder / path).write_bytes(value)

    def _projected(self, pod: Any, folder: Path, projected: Any) -> None:
        from kubernetes import client

        ns = pod.metadata.namespace
        for source in projected.sources or []:
            if source.service_account_token is not None:
                token = source.service_account_token
                request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
                    audiences=[token.audience] if token.audience else [],
                    expiration_seconds=token.expiration_seconds or 3600,
                    bound_object_ref=client.V1BoundObjectReference(
                        kind="Pod", api_version="v1", name=pod.metadata.name,
                        uid=pod.metadata.uid)))
                issued = self.core.create_namespaced_service_account_token(
                    pod.spec.service_account_name or "default", ns, request)
                (folder / token.path).write_text(issued.status.token)
            elif source.config_map is not None:
                self._files(folder, self._data("configmap", ns, source.config_map.name,
                                               bool(source.config_map.optional)),
                            source.config_map.items)
            elif source.secret is not None:
                self._files(folder, self._data("secret", ns, source.secret.name,
                                               bool(source.secret.optional)), source.secret.items)
            elif source.downward_api is not None:
                for item in source.downward_api.items or []:
                    value = {"metadata.namespace": ns, "metadata.name": pod.metadata.name}.get(
                        item.field_ref.field_path if item.field_ref else "", "")
                    (folder / item.path).write_text(value)
