"""The programs the chart runs (files/scripts/) and the rendered MLflow command, run for real.

No cluster is available, so the rendered containers' commands are executed on this machine
with the same arguments and environment, Secret references resolved to test values and the
container paths mapped into a temporary directory.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import boto3
import pytest
import yaml
from chart_helpers import CHART_DIR, INSTALL_SCRIPT, Renderer
from moto.server import ThreadedMotoServer

SCRIPTS = CHART_DIR / "files" / "scripts"
VENV_BIN = Path(sys.executable).parent


def load_script(name: str) -> ModuleType:
    """Import one of the chart's scripts as a module."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture()
def s3_server() -> Iterator[str]:
    """A moto S3 server on a free local port; yields its endpoint URL."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def test_bootstrap_creates_missing_buckets_and_is_idempotent(s3_server: str) -> None:
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": s3_server,
    }
    s3 = boto3.client(
        "s3",
        endpoint_url=s3_server,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    # moto keeps one bucket table per process, shared by every server in it: other tests'
    # buckets may be there, so names are unique and the check is what this run added.
    exchange, mlflow = (f"fedtune-{kind}-{uuid.uuid4().hex[:8]}" for kind in ("exchange", "mlflow"))
    before = {b["Name"] for b in s3.list_buckets()["Buckets"]}
    cmd = [sys.executable, str(SCRIPTS / "bootstrap_buckets.py"), "--wait-seconds=5", exchange, mlflow]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert first.returncode == 0, first.stderr
    assert f"bucket {exchange} created" in first.stderr
    assert {b["Name"] for b in s3.list_buckets()["Buckets"]} - before == {exchange, mlflow}
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert second.returncode == 0, second.stderr
    assert f"bucket {mlflow} already exists" in second.stderr


def test_bootstrap_fails_with_a_fix_when_the_store_is_unreachable() -> None:
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{free_port()}",
        "AWS_MAX_ATTEMPTS": "1",
    }
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "bootstrap_buckets.py"), "--wait-seconds=0", "b-1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 4
    assert "fix: check objectStore.mode and the endpoint" in proc.stderr


def test_upload_pipelines_with_no_files_does_nothing(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPTS / "upload_pipelines.py"),
            "--host=http://127.0.0.1:9",
            f"--dir={tmp_path}",
            "--version-name=0.1.0-r1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "nothing to upload" in proc.stderr


def test_mlflow_auth_starter_requires_its_secrets() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_AUTH")}
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "start_mlflow_auth.py"), "server"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "MLFLOW_AUTH_ADMIN_PASSWORD" in proc.stderr and "fix:" in proc.stderr


def test_mlflow_auth_config_round_trips_a_url_encoded_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.server.auth.config import read_auth_config

    uri = "postgresql://mlflow:p%40ss%25word@db:5432/mlflow_auth"
    path = tmp_path / "basic_auth.ini"
    load_script("start_mlflow_auth").write_config(str(path), uri, "READ")
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    monkeypatch.setenv("MLFLOW_AUTH_CONFIG_PATH", str(path))
    config = read_auth_config()
    assert config.database_uri == uri
    assert config.default_permission == "READ"


# Test contents of the Secrets the rendered pods reference, by (secret name, key).
SECRETS = {
    ("fedtune-s3", "access-key-id"): "test-access-key",
    ("fedtune-s3", "secret-access-key"): "test-secret-key",
    ("mlflow-auth", "admin-password"): "Sentinel-Admin-Pw-7f3a9c!",
    ("mlflow-auth", "flask-secret-key"): "0123456789abcdef0123456789abcdef",
    ("fedtune-mlflow-pipeline", "username"): "fedtune-pipeline",
    ("fedtune-mlflow-pipeline", "password"): "Sentinel-Pipeline-Pw-41c2e8",
    ("fedtune-presigner", "access-key-id"): "presigner-key",
    ("fedtune-presigner", "secret-access-key"): "presigner-secret",
}


def local_command(
    container: dict[str, Any], root: Path, port: int
) -> tuple[list[str], dict[str, str]]:
    """The container's command and environment, made runnable on this machine."""
    paths = {
        "/opt/fedtune/scripts": str(SCRIPTS),
        "/tmp": str(root / "tmp"),
        "/data": str(root / "data"),
    }

    # One pass, longest container path first: replacing sequentially would rewrite a host
    # path that itself starts with /tmp (e.g. a checkout under /tmp) a second time.
    pattern = re.compile("|".join(re.escape(p) for p in sorted(paths, key=len, reverse=True)))

    def local(text: str) -> str:
        return pattern.sub(lambda m: paths[m.group(0)], text)

    args = [local(a) for a in container["command"] + container["args"]]
    args = [sys.executable if a == "python" else a for a in args]
    args = [f"--port={port}" if a.startswith("--port=") else a for a in args]
    args = ["--host=127.0.0.1" if a.startswith("--host=") else a for a in args]
    args = ["--workers=1" if a.startswith("--workers=") else a for a in args]
    env = {"PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = local(item["value"])
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = SECRETS[(ref["name"], ref["key"])]
    return args, env


def http_status(url: str, host: str, auth: tuple[str, str] | None = None) -> int:
    request = urllib.request.Request(url, headers={"Host": host})
    if auth:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@contextmanager
def running_mlflow(render: Renderer, tmp_path: Path) -> Iterator[tuple[str, int, Path]]:
    """MLflow started exactly as the chart configures it with basic auth on; yields its base
    URL, port and log file, and stops it afterwards."""
    rendered = render(
        "minimal", set_values=["mlflow.auth.enabled=true", "mlflow.auth.existingSecret=mlflow-auth"]
    )
    assert rendered.returncode == 0, rendered.stderr
    (deployment,) = [
        d for d in rendered.of_kind("Deployment") if d["metadata"]["name"] == "ft-fedtune-mlflow"
    ]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    for sub in ("tmp", "data"):
        (tmp_path / sub).mkdir()
    port = free_port()
    cmd, env = local_command(container, tmp_path, port)
    log_path = tmp_path / "server.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(
            cmd,
            env=env,
            cwd=tmp_path / "tmp",
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if http_status(f"{base}/health", f"127.0.0.1:{port}") == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert server.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "MLflow did not become healthy in 120 s"
            time.sleep(0.5)  # polling a starting server; there is nothing to wait on instead
        yield base, port, log_path
    finally:
        if server.poll() is None:
            os.killpg(server.pid, 15)
        server.wait(timeout=30)


@pytest.mark.slow
def test_rendered_mlflow_server_runs_with_auth_and_host_checks(
    render: Renderer, tmp_path: Path
) -> None:
    """MLflow started exactly as the chart configures it: healthy, answers the service's DNS
    names, refuses foreign Host headers, requires the admin login, never logs the password."""
    with running_mlflow(render, tmp_path) as (base, port, log_path):
        api = f"{base}/api/2.0/mlflow/experiments/search?max_results=1"
        # 401 means the Host header passed MLflow's check and the auth layer answered.
        for host in (
            "ft-fedtune-mlflow.fedtune.svc.cluster.local:5000",
            "ft-fedtune-mlflow:5000",
            "ft-fedtune-mlflow.fedtune.svc",
            f"localhost:{port}",
        ):
            assert http_status(api, host) == 401, host
        assert http_status(api, "attacker.example") == 403
        # One signed-in call (password hashing is slow on small machines): the admin password
        # from the Secret works.
        admin = ("admin", SECRETS[("mlflow-auth", "admin-password")])
        assert http_status(api, "ft-fedtune-mlflow.fedtune.svc.cluster.local:5000", admin) == 200
    log_text = log_path.read_text()
    assert SECRETS[("mlflow-auth", "admin-password")] not in log_text
    assert (tmp_path / "data" / "basic_auth.db").exists()
    assert (tmp_path / "data" / "mlflow.db").exists()


def _track(base: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A provider step's MLflow calls, in a process with only ``env`` (plus PATH)."""
    code = (
        "import mlflow\n"
        "mlflow.set_experiment('fedtune-itest')\n"
        "with mlflow.start_run():\n"
        "    mlflow.log_metric('loss', 0.5)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"),
             "MLFLOW_TRACKING_URI": base, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", **env},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.mark.slow
def test_pipeline_pods_track_to_an_auth_mlflow_as_the_user_the_bootstrap_creates(
    render: Renderer, tmp_path: Path
) -> None:
    """The bootstrap Job's users container creates the pipeline's MLflow user; a provider
    task's environment, as the compiled pipeline maps it from the Secret, then logs a run."""

    from fedtune.config.secrets import MLFLOW_SECRET
    from fedtune.pipelines.builder import ClusterSettings

    rendered = render(
        "minimal", set_values=["mlflow.auth.enabled=true", "mlflow.auth.existingSecret=mlflow-auth"]
    )
    (job,) = [d for d in rendered.of_kind("Job") if d["metadata"]["name"].endswith("-bucket-bootstrap")]
    users = next(c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "users")
    with running_mlflow(render, tmp_path) as (base, port, log_path):
        cmd, env = local_command(users, tmp_path, port)
        cmd = [f"--mlflow-uri={base}" if a.startswith("--mlflow-uri=") else a for a in cmd]
        # No MinIO here: its half (the presigning user) is left out, the MLflow half runs.
        assert "--presigner-bucket=fedtune-exchange" in cmd
        cmd = [a for a in cmd if not a.startswith("--presigner-bucket=")]
        for attempt in ("creates", "is idempotent"):
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
            assert proc.returncode == 0, (attempt, proc.stderr[-3000:])
        assert "already exists; password updated" in proc.stderr
        # The provider task's env: every secretAsEnv the compiled pipeline maps from the
        # MLflow Secret, resolved from the Secret's test contents.
        provider_env = _compiled_secret_env(tmp_path, ClusterSettings(mlflow_uri=base), MLFLOW_SECRET)
        assert set(provider_env) == {"MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"}
        denied = _track(base, {})
        assert denied.returncode != 0 and "401" in denied.stderr, denied.stderr[-2000:]
        tracked = _track(base, provider_env)
        assert tracked.returncode == 0, tracked.stderr[-3000:]
        admin_env = {
            "MLFLOW_TRACKING_USERNAME": "admin",
            "MLFLOW_TRACKING_PASSWORD": SECRETS[("mlflow-auth", "admin-password")],
        }
        check = subprocess.run(
            [sys.executable, "-c",
             "import sys; from mlflow.server.auth.client import AuthServiceClient as C; "
             "print(C(sys.argv[1]).get_user(sys.argv[2]).is_admin)", base,
             SECRETS[(MLFLOW_SECRET, "username")]],
            env={"PATH": os.environ["PATH"], **admin_env},
            capture_output=True, text=True, timeout=120, check=False,
        )
        assert check.stdout.strip() == "False", check.stderr[-2000:]  # not an admin
    log_text = log_path.read_text()
    assert SECRETS[(MLFLOW_SECRET, "password")] not in log_text + proc.stderr + tracked.stderr


def _compiled_secret_env(tmp_path: Path, settings: Any, secret: str) -> dict[str, str]:
    """The env a provider task gets from ``secret`` in the compiled pipeline, values filled in."""
    from fedtune.config import parse_job
    from fedtune.pipelines.compiling import compile_job
    from tests.kfp.conftest import cluster_job_dict

    out = tmp_path / "pipeline.yaml"
    compile_job(parse_job(cluster_job_dict()), out, settings=settings)
    platform = list(yaml.safe_load_all(out.read_text()))[-1]
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    init = next(e for name, e in executors.items() if name.startswith("exec-server-init"))
    env = {}
    for ref in init["secretAsEnv"]:
        if ref["secretName"] == secret:
            assert ref.get("optional") is True  # absent when MLflow auth is off
            for pair in ref["keyToEnv"]:
                env[pair["envVar"]] = SECRETS[(secret, pair["secretKey"])]
    return env


def test_install_script_skips_a_working_helm(helm_bin: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(INSTALL_SCRIPT), "--dest", str(helm_bin.parent)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "already installed" in proc.stderr
    assert "downloading" not in proc.stderr


def test_bootstrap_users_names_a_missing_secret_key_and_prints_no_credential() -> None:
    env = {
        "PATH": os.environ["PATH"],
        "AWS_ACCESS_KEY_ID": "root",
        "AWS_SECRET_ACCESS_KEY": "root-secret-never-printed",
        "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9",
        "PRESIGNER_ACCESS_KEY_ID": "presigner",  # its secret key is missing
    }
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "bootstrap_users.py"), "--presigner-bucket=x", "--wait-seconds=0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "PRESIGNER_SECRET_ACCESS_KEY is empty" in proc.stderr
    assert "objectStore.presignerSecret" in proc.stderr
    assert "root-secret-never-printed" not in proc.stdout + proc.stderr


def test_the_bootstrap_runs_the_users_container_only_when_there_is_a_user_to_create(
    render: Renderer,
) -> None:
    def containers(*values: str) -> dict[str, Any]:
        rendered = render("minimal", set_values=list(values))
        assert rendered.returncode == 0, rendered.stderr
        (job,) = [d for d in rendered.of_kind("Job") if d["metadata"]["name"].endswith("-bucket-bootstrap")]
        return {c["name"]: c for c in job["spec"]["template"]["spec"]["containers"]}

    users = containers()["users"]  # MinIO: the presigning user
    assert "--presigner-bucket=fedtune-exchange" in users["args"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in users["env"] if "valueFrom" in e}
    assert refs["PRESIGNER_SECRET_ACCESS_KEY"] == {
        "name": "fedtune-presigner",
        "key": "secret-access-key",
    }
    assert set(containers("objectStore.presignerSecret=")) == {"bootstrap"}


@pytest.mark.parametrize(
    ("uri", "said"),
    [("", "MLFLOW_BACKEND_STORE_URI is empty"),
     ("sqlite:////data/secret-path.db", "MLFLOW_BACKEND_STORE_URI is not a postgresql:// URI")],
)
def test_mlflow_db_migration_refuses_a_store_that_is_not_postgresql(uri: str, said: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "migrate_mlflow_db.py")],
        env={"PATH": os.environ["PATH"], "MLFLOW_BACKEND_STORE_URI": uri},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert said in proc.stderr and "fix: put postgresql://" in proc.stderr
    assert not uri or uri not in proc.stderr  # a URI may carry a password: never printed
