"""Real servers started as the chart starts them, for the `cluster` tests of the chart.

``chart_minio``: the minimal install's MinIO Deployment (built from source by
``scripts/servers/install_minio.sh``) run as a local process with its rendered args and env,
and the bucket-bootstrap Job's containers, run the same way on demand. Only the endpoint
differs: a pod would reach MinIO by its Service name, a local process by 127.0.0.1.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from chart_helpers import CHART_DIR, Renderer
from containers import Secrets, local_process

from tests.helpers.servers import Server, free_port, minio_binary, start, wait_http_ok

SCRIPTS = CHART_DIR / "files" / "scripts"
SERVICE_URL = "http://ft-fedtune-minio.fedtune.svc.cluster.local:"  # what pods would reach
EXCHANGE, PROVIDER, ARTIFACTS = "fedtune-exchange", "fedtune-provider", "fedtune-mlflow"
ROOT = ("fedtune-root", "root-secret-never-logged-1f9b")
PRESIGNER = ("fedtune-presigner", "presigner-secret-never-logged-7c2d")
SECRETS: Secrets = {
    ("fedtune-s3", "access-key-id"): ROOT[0],
    ("fedtune-s3", "secret-access-key"): ROOT[1],
    ("fedtune-presigner", "access-key-id"): PRESIGNER[0],
    ("fedtune-presigner", "secret-access-key"): PRESIGNER[1],
}


@pytest.fixture(scope="session")
def minio_bin() -> Path:
    """The real MinIO server binary (built on first use, then cached)."""
    return minio_binary()


@dataclass
class ChartMinio:
    """MinIO as the chart's Deployment runs it (``start``/``stop``: a pod restart keeps /data),
    and the rendered bootstrap Job."""

    endpoint: str
    argv: list[str]
    env: dict[str, str]
    ready_url: str
    job: dict[str, Any]
    root: Path
    server: Server | None = None

    def start(self) -> None:
        self.server = start(self.argv, self.env, self.root / "minio.log", self.root / "tmp")
        wait_http_ok(self.ready_url, self.server)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()

    def log(self) -> str:
        return (self.root / "minio.log").read_text(errors="replace")

    def client(self, keys: tuple[str, str]) -> Any:
        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id=keys[0], aws_secret_access_key=keys[1],
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )

    def start_bootstrap(
        self, secrets: Secrets = SECRETS, mlflow_url: str | None = None
    ) -> list[tuple[str, subprocess.Popen[str]]]:
        """Start the Job's containers together, as the pod does; ``mlflow_url`` stands in for
        MLflow's Service URL."""
        started = []
        for container in self.job["spec"]["template"]["spec"]["containers"]:
            argv, env = local_process(
                container, secrets, {"/opt/fedtune/scripts": SCRIPTS, "/tmp": self.root / "tmp"}
            )
            if mlflow_url is not None:
                argv = [f"--mlflow-uri={mlflow_url}" if a.startswith("--mlflow-uri=") else a
                        for a in argv]
            for name in ("AWS_ENDPOINT_URL_S3", "MLFLOW_S3_ENDPOINT_URL"):
                if name in env:
                    assert env[name].startswith(SERVICE_URL), env[name]
                    env[name] = self.endpoint
            proc = subprocess.Popen(
                argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            started.append((str(container["name"]), proc))
        return started

    def bootstrap(
        self, secrets: Secrets = SECRETS, mlflow_url: str | None = None
    ) -> dict[str, subprocess.CompletedProcess[str]]:
        """Run the Job's pod to completion; every container must succeed."""
        return finish(self.start_bootstrap(secrets, mlflow_url))


def finish(
    started: list[tuple[str, subprocess.Popen[str]]], timeout_s: float = 300
) -> dict[str, subprocess.CompletedProcess[str]]:
    """Wait for a pod's containers; each must exit 0 (the Job's pod succeeds)."""
    done = {}
    for name, proc in started:
        out, err = proc.communicate(timeout=timeout_s)
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        assert proc.returncode == 0, (name, err[-3000:])
    return done


@pytest.fixture()
def chart_minio(render: Renderer, minio_bin: Path, tmp_path: Path) -> Iterator[ChartMinio]:
    """The minimal install's MinIO Deployment, started as a local process."""
    rendered = render("minimal")
    assert rendered.returncode == 0, rendered.stderr
    (deployment,) = [
        d for d in rendered.of_kind("Deployment") if d["metadata"]["name"] == "ft-fedtune-minio"
    ]
    (job,) = [j for j in rendered.of_kind("Job") if j["metadata"]["name"].endswith("bootstrap")]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    for sub in ("data", "tmp"):
        (tmp_path / sub).mkdir()
    port = free_port()
    argv, env = local_process(
        container, SECRETS, {"/data": tmp_path / "data", "/tmp": tmp_path / "tmp"}, [str(minio_bin)]
    )
    assert argv[1:3] == ["server", str(tmp_path / "data")], argv
    argv = [f"--address=127.0.0.1:{port}" if a.startswith("--address=") else a for a in argv]
    ready = container["readinessProbe"]["httpGet"]["path"]
    minio = ChartMinio(
        f"http://127.0.0.1:{port}", argv, env, f"http://127.0.0.1:{port}{ready}", job, tmp_path
    )
    try:
        minio.start()
        yield minio
    finally:
        minio.stop()
