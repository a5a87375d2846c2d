"""Real servers as local processes for the ``cluster`` tests: MinIO and PostgreSQL.

MinIO is built from source by ``scripts/servers/install_minio.sh`` (cached outside the
repository); PostgreSQL is Debian's package, installed by ``scripts/servers/setup.sh``. Each
server runs on a free port of 127.0.0.1 in a fresh temporary folder and is stopped by its PID.

A server this machine cannot have (no Go to build MinIO; no root or apt-get for PostgreSQL)
skips its tests with the reason. ``make test`` sets ``FEDTUNE_REQUIRE_SERVERS=1`` after
``make servers``: there a server that could have been provided but is missing is a failure,
so CI cannot pass by skipping them.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, NoReturn
from urllib.parse import quote

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_MINIO = REPO_ROOT / "scripts" / "servers" / "install_minio.sh"
REQUIRE_ENV = "FEDTUNE_REQUIRE_SERVERS"
START_TIMEOUT_S = 60.0


def unavailable(reason: str, *, installable: bool) -> NoReturn:
    """Skip for a server this machine cannot have; where ``make servers`` could have provided
    it (``installable``) and ``make test`` says it did, fail instead."""
    if installable and os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason} (${REQUIRE_ENV}=1: `make servers` should have provided it)",
                    pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def minio_binary() -> Path:
    """The MinIO binary, built once by the install script (exit 3: no Go on this machine)."""
    proc = subprocess.run(
        ["bash", str(INSTALL_MINIO)], capture_output=True, text=True, timeout=1800, check=False
    )
    if proc.returncode == 3:
        unavailable(f"MinIO cannot be built here: {proc.stderr.strip()}", installable=False)
    if proc.returncode != 0:
        pytest.fail(f"{INSTALL_MINIO.name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}",
                    pytrace=False)
    return Path(proc.stdout.strip())


@dataclass
class Server:
    """A started server process; its output goes to ``log``."""

    process: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        """SIGTERM (PostgreSQL: a smart shutdown is too slow, so SIGINT), then SIGKILL."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=20)


def start(cmd: list[str], env: dict[str, str], log: Path, cwd: Path, **popen: object) -> Server:
    """Start ``cmd`` in its own session, stdout and stderr into ``log``."""
    handle: IO[bytes]
    with log.open("wb") as handle:
        process = subprocess.Popen(
            cmd, env=env, cwd=cwd, stdout=handle, stderr=subprocess.STDOUT,
            start_new_session=True, **popen,  # type: ignore[call-overload]
        )
    return Server(process, log)


def wait_http_ok(url: str, server: Server, timeout_s: float = START_TIMEOUT_S) -> None:
    """Poll ``url`` until it answers 200; fail with the server's log if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        assert server.process.poll() is None, f"server exited:\n{server.tail()}"
        assert time.monotonic() < deadline, f"{url} not ready in {timeout_s:g} s:\n{server.tail()}"
        time.sleep(0.3)  # polling a starting server; there is nothing to wait on instead


# --- PostgreSQL ---------------------------------------------------------------------------


def postgres_bindir() -> Path | None:
    """Debian's server binaries (off PATH, one folder per major version): the newest."""
    found = sorted(
        (p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "initdb").exists()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    return found[-1] if found else None


@dataclass(frozen=True)
class Postgres:
    """A running PostgreSQL: one password-protected superuser on 127.0.0.1."""

    port: int
    user: str
    password: str

    def uri(self, database: str) -> str:
        """A SQLAlchemy URI, the password percent-encoded as a URI must carry it."""
        return (
            f"postgresql://{self.user}:{quote(self.password, safe='')}@127.0.0.1:{self.port}"
            f"/{database}"
        )


@contextmanager
def postgres_server(databases: list[str], password: str) -> Iterator[Postgres]:
    """A fresh cluster (initdb) with ``databases``, password auth only, stopped afterwards.

    PostgreSQL refuses to run as root; as root the cluster belongs to the ``postgres`` user.
    """
    bindir = postgres_bindir()
    if bindir is None:
        unavailable(
            "PostgreSQL is not installed (/usr/lib/postgresql/*/bin/initdb); run "
            "scripts/servers/setup.sh as root",
            installable=os.geteuid() == 0 and shutil.which("apt-get") is not None,
        )
    as_user: dict[str, object] = {}
    # Not under pytest's tmp_path: its parent is private to root, the postgres user could not
    # enter it.
    root = Path(tempfile.mkdtemp(prefix="fedtune-pg-"))
    if os.geteuid() == 0:
        as_user = {"user": "postgres", "group": "postgres", "extra_groups": []}
        shutil.chown(root, "postgres", "postgres")
    user, port = "fedtune", free_port()
    env = {"PATH": os.environ.get("PATH", ""), "LC_ALL": "C"}
    pwfile = root / "pw"
    pwfile.write_text(password + "\n")
    if as_user:
        shutil.chown(pwfile, "postgres", "postgres")
    server = None
    try:
        subprocess.run(
            [str(bindir / "initdb"), "-D", str(root / "data"), "-U", user, "-E", "UTF8",
             "--auth=scram-sha-256", f"--pwfile={pwfile}", "--no-sync", "--locale=C"],
            env=env, capture_output=True, check=True, timeout=120,
            **as_user,  # type: ignore[arg-type]
        )
        pwfile.unlink()
        # fsync off (-F): a throwaway cluster; the socket in our folder, not /run/postgresql.
        server = start(
            [str(bindir / "postgres"), "-D", str(root / "data"), "-h", "127.0.0.1",
             "-p", str(port), "-k", str(root), "-F"],
            env, root / "postgres.log", root, **as_user,
        )
        client_env = {**env, "PGPASSWORD": password}
        deadline = time.monotonic() + START_TIMEOUT_S
        while subprocess.run(
            [str(bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port), "-q"],
            env=client_env, check=False, timeout=30,
        ).returncode != 0:
            assert server.process.poll() is None, f"postgres exited:\n{server.tail()}"
            assert time.monotonic() < deadline, f"postgres not ready:\n{server.tail()}"
            time.sleep(0.2)  # polling a starting server
        for name in databases:
            subprocess.run(
                [str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", user, name],
                env=client_env, capture_output=True, check=True, timeout=60,
            )
        yield Postgres(port, user, password)
    finally:
        if server is not None:
            # SIGINT is PostgreSQL's "fast" shutdown; SIGTERM ("smart") waits for clients.
            server.process.send_signal(signal.SIGINT)
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
