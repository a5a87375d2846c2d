"""The chart's production MLflow: PostgreSQL backend store, artifacts in the chart's MinIO.

Everything is real and started as the chart starts it: PostgreSQL (Debian's package, a fresh
cluster per module), MinIO built from source with the bucket bootstrap run, and ``mlflow
server`` with the rendered args and env, its store URI taken from the Secret that
``mlflow.backend.postgresql.existingSecret`` names. fedtune then does what a user does: runs
a job that tracks to that server and registers its model, and promotes it with ``fedtune
promote``. A second server process on the same database stands for a second replica (or a
restarted pod), which SQLite on a volume cannot be.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helpers import Renderer
from chart_servers import (
    ARTIFACTS,
    ROOT,
    SCRIPTS,
    SECRETS,
    ChartMinio,
)
from containers import Secrets, local_process

from tests.helpers.servers import (
    Postgres,
    Server,
    free_port,
    postgres_server,
    start,
    wait_http_ok,
)

pytestmark = pytest.mark.cluster

# A password as people pick them: characters a URI must percent-encode, '%' included (which
# also trips configparser interpolation in MLflow's auth config and Alembic).
DB_PASSWORD = "p@ss:w/rd%41-never-logged"
DB_SECRET = "mlflow-db"
ADMIN_PASSWORD = "Sentinel-Admin-Pw-7f3a9c!"
PIPELINE = ("fedtune-pipeline", "Sentinel-Pipeline-Pw-41c2e8")
POSTGRES_VALUES = [
    "mlflow.backend.type=postgresql",
    f"mlflow.backend.postgresql.existingSecret={DB_SECRET}",
]
AUTH_VALUES = ["mlflow.auth.enabled=true", "mlflow.auth.existingSecret=mlflow-auth"]


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    """One PostgreSQL for the module: tracking and auth databases, and a pair no test but
    the rollout one touches."""
    with postgres_server(["mlflow", "mlflow_auth", "fresh", "fresh_auth"], DB_PASSWORD) as server:
        yield server


def db_secrets(pg: Postgres, database: str = "mlflow") -> Secrets:
    """The test Secrets plus the PostgreSQL Secret the operator creates for production."""
    return {
        **SECRETS,
        (DB_SECRET, "uri"): pg.uri(database),
        (DB_SECRET, "auth-uri"): pg.uri(f"{database}_auth"),
        ("mlflow-auth", "admin-password"): ADMIN_PASSWORD,
        ("mlflow-auth", "flask-secret-key"): "0123456789abcdef0123456789abcdef",
        ("fedtune-mlflow-pipeline", "username"): PIPELINE[0],
        ("fedtune-mlflow-pipeline", "password"): PIPELINE[1],
    }


def mlflow_pod(render: Renderer, *values: str) -> dict[str, Any]:
    """The pod spec of the rendered MLflow Deployment with the PostgreSQL backend."""
    rendered = render("minimal", set_values=[*POSTGRES_VALUES, *values])
    assert rendered.returncode == 0, rendered.stderr
    (deployment,) = [
        d for d in rendered.of_kind("Deployment") if d["metadata"]["name"] == "ft-fedtune-mlflow"
    ]
    # PostgreSQL mode: no SQLite volume, and the URI only by reference to the Secret.
    claims = [p["metadata"]["name"] for p in rendered.of_kind("PersistentVolumeClaim")]
    assert not [name for name in claims if "mlflow" in name], claims
    pod = deployment["spec"]["template"]["spec"]
    for container in pod.get("initContainers", []) + pod["containers"]:
        store = next(e for e in container["env"] if e["name"] == "MLFLOW_BACKEND_STORE_URI")
        assert store["valueFrom"]["secretKeyRef"] == {"name": DB_SECRET, "key": "uri"}
    return dict(pod)


def container_process(
    container: dict[str, Any], secrets: Secrets, minio: ChartMinio, root: Path
) -> tuple[list[str], dict[str, str]]:
    """A container of the MLflow pod as a local process in ``root``."""
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    argv, env = local_process(
        container, secrets, {"/opt/fedtune/scripts": SCRIPTS, "/tmp": root / "tmp"}
    )
    for name in ("AWS_ENDPOINT_URL_S3", "MLFLOW_S3_ENDPOINT_URL"):
        if name in env:
            env[name] = minio.endpoint
    return argv, env


def run_init_containers(
    pod: dict[str, Any], secrets: Secrets, minio: ChartMinio, roots: list[Path]
) -> list[str]:
    """Start the init containers of one pod per root at once, as a rollout does; each must
    succeed. Returns their output."""
    started = []
    for root in roots:
        for container in pod.get("initContainers", []):
            argv, env = container_process(container, secrets, minio, root)
            started.append(subprocess.Popen(argv, env=env, cwd=root / "tmp", text=True,
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = [proc.communicate(timeout=300)[0] for proc in started]
    for proc, out in zip(started, outputs, strict=True):
        assert proc.returncode == 0, out[-3000:]
    return outputs


@contextmanager
def mlflow_replica(
    pod: dict[str, Any], secrets: Secrets, minio: ChartMinio, root: Path, wait: bool = True
) -> Iterator[tuple[str, Server]]:
    """One MLflow pod's server container as a local process (its init containers already
    run); yields (URL, server), once it is healthy unless ``wait`` is False."""
    argv, env = container_process(pod["containers"][0], secrets, minio, root)
    port = free_port()
    argv = [
        f"--port={port}" if a.startswith("--port=")
        else "--host=127.0.0.1" if a.startswith("--host=")
        else "--workers=1" if a.startswith("--workers=")  # two cores; one replica per process
        else a
        for a in argv
    ]
    server = start(argv, env, root / "mlflow.log", root / "tmp")
    try:
        if wait:
            wait_until_healthy(f"http://127.0.0.1:{port}", server)
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.stop()


def wait_until_healthy(url: str, server: Server) -> None:
    # MLflow imports for tens of seconds on a busy two-core machine.
    wait_http_ok(f"{url}/health", server, timeout_s=240)


def query(pg: Postgres, database: str, sql: str) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` read straight from PostgreSQL, behind MLflow's back."""
    import psycopg

    with psycopg.connect(pg.uri(database)) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return list(cur.fetchall())


@pytest.mark.slow
def test_a_fedtune_run_tracks_registers_and_promotes_through_mlflow_on_postgresql(
    render: Renderer,
    chart_minio: ChartMinio,
    postgres: Postgres,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mlflow import MlflowClient

    from fedtune.cli.main import main
    from fedtune.serving.mlflow_registry import ModelRegistry
    from fedtune.serving.refs import parse_model_spec
    from tests.integration.conftest import tiny_job_dict

    chart_minio.bootstrap()
    pod = mlflow_pod(render)
    secrets = db_secrets(postgres)
    run_init_containers(pod, secrets, chart_minio, [tmp_path / "pod-1", tmp_path / "pod-2"])
    for name in ("MLFLOW_TRACKING_URI", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)  # pipeline steps need only MLflow's URL
    with (
        mlflow_replica(pod, secrets, chart_minio, tmp_path / "pod-1") as (url, first),
        # A second replica (or the restarted pod) on the same database, started meanwhile.
        mlflow_replica(pod, secrets, chart_minio, tmp_path / "pod-2", wait=False) as (
            url2, second,
        ),
    ):
        job = tiny_job_dict(
            tmp_path / "work", rounds=1,
            tracking={"backend": "mlflow", "tracking_uri": url, "experiment": "pg-itest"},
        )
        job_file = tmp_path / "job.yaml"
        job_file.write_text(yaml.safe_dump(job))
        summary = tmp_path / "summary.json"
        assert main(["run", str(job_file), "--no-progress", "--summary-json", str(summary)]) == 0
        assert main(["promote", "itest", "--version", "1", "--alias", "champion",
                     "--tracking-uri", url]) == 0
        wait_until_healthy(url2, second)
        first.stop()
        # The second replica sees everything the first one wrote.
        client = MlflowClient(tracking_uri=url2, registry_uri=url2)
        version = client.get_model_version_by_alias("itest", "champion")
        assert version.version == "1"
        experiment = client.get_experiment_by_name("pg-itest")
        (run,) = client.search_runs([experiment.experiment_id])
        assert run.info.status == "FINISHED" and run.data.metrics
        # The model's files went through MLflow's proxy into MinIO, and come back the same way
        # through the registry code `fedtune serve-local` uses.
        hf_dir = ModelRegistry.connect(url2).download_hf_dir(
            parse_model_spec("itest@champion"), tmp_path / "downloaded"
        )
        assert (hf_dir / "config.json").is_file()
    # The rows are in PostgreSQL: the store really is the database the Secret names.
    assert query(postgres, "mlflow", "select count(*) from runs") == [(1,)]
    aliases = "select alias, version from registered_model_aliases order by alias"
    # The job's own alias on registration, and the one `fedtune promote` moved.
    assert query(postgres, "mlflow", aliases) == [("candidate", 1), ("champion", 1)]
    listed = chart_minio.client(ROOT).list_objects_v2(Bucket=ARTIFACTS, Prefix="artifacts/")
    assert any(o["Key"].endswith("/MLmodel") for o in listed.get("Contents", [])), listed
    for pod in ("pod-1", "pod-2"):
        assert DB_PASSWORD not in (tmp_path / pod / "mlflow.log").read_text()


def _track_as(url: str, user: tuple[str, str]) -> subprocess.CompletedProcess[str]:
    """A provider step's MLflow calls, in a process that has only the pipeline's login."""
    code = (
        "import mlflow\n"
        "mlflow.set_experiment('fedtune-auth-pg')\n"
        "with mlflow.start_run():\n"
        "    mlflow.log_metric('loss', 0.5)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp", "MLFLOW_TRACKING_URI": url,
             "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_TRACKING_USERNAME": user[0],
             "MLFLOW_TRACKING_PASSWORD": user[1]},
        capture_output=True, text=True, timeout=180, check=False,
    )


@pytest.mark.slow
def test_mlflow_auth_keeps_its_users_in_postgresql_across_restarts(
    render: Renderer, chart_minio: ChartMinio, postgres: Postgres, tmp_path: Path
) -> None:
    """With auth on, both databases live in PostgreSQL: the pipeline user the bootstrap
    creates survives a restart of the server, and tracks as that user."""
    pod = mlflow_pod(render, *AUTH_VALUES)
    secrets = db_secrets(postgres)
    run_init_containers(pod, secrets, chart_minio, [tmp_path / "pod-1"])
    rendered = render("minimal", set_values=[*POSTGRES_VALUES, *AUTH_VALUES])
    (job,) = [j for j in rendered.of_kind("Job") if j["metadata"]["name"].endswith("bootstrap")]
    with mlflow_replica(pod, secrets, chart_minio, tmp_path / "pod-1") as (url, _):
        chart_minio.job = job
        runs = chart_minio.bootstrap(secrets, mlflow_url=url)
        assert "MLflow user fedtune-pipeline created" in runs["users"].stderr
    with mlflow_replica(pod, secrets, chart_minio, tmp_path / "pod-2") as (url, _):
        tracked = _track_as(url, PIPELINE)
        assert tracked.returncode == 0, tracked.stderr[-3000:]
        denied = _track_as(url, (PIPELINE[0], "wrong-password"))
        assert denied.returncode != 0 and "401" in denied.stderr
    users = query(postgres, "mlflow_auth", "select username, is_admin from users order by username")
    assert users == [("admin", True), (PIPELINE[0], False)]


@pytest.mark.slow
def test_two_replicas_of_a_fresh_install_start_together_and_both_serve(
    render: Renderer, chart_minio: ChartMinio, postgres: Postgres, tmp_path: Path
) -> None:
    """`helm install` with mlflow.replicas=2 on an empty database: both pods start at once.
    Without the migration init container the servers race to create the tables and one
    crashes on a duplicate ``alembic_version``; with it the first pod migrates, the second
    waits for the lock and finds nothing to do."""
    pod = mlflow_pod(render, *AUTH_VALUES, "mlflow.replicas=2")
    secrets = db_secrets(postgres, "fresh")
    roots = [tmp_path / "pod-1", tmp_path / "pod-2"]
    outputs = run_init_containers(pod, secrets, chart_minio, roots)
    with (
        mlflow_replica(pod, secrets, chart_minio, roots[0], wait=False) as (url1, first),
        mlflow_replica(pod, secrets, chart_minio, roots[1], wait=False) as (url2, second),
    ):
        wait_until_healthy(url1, first)
        wait_until_healthy(url2, second)
    for root in roots:
        log = (root / "mlflow.log").read_text()
        assert "Traceback" not in log, log[-3000:]
    assert query(postgres, "fresh_auth", "select username from users") == [("admin",)]
    # The race is not certain to show on every machine; the lock that prevents it must be.
    assert [c["name"] for c in pod.get("initContainers", [])] == ["db-migrate"]
    assert all("MLflow databases are at the installed MLflow's schema" in o for o in outputs)
    assert all(DB_PASSWORD not in o for o in outputs)
