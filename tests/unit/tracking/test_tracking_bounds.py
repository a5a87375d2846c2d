"""MLflow waits are bounded: a server that is down or hung fails in seconds, not minutes.

MLflow's own defaults (7 retries, doubling back-off, 120 s per answer) took 260 s to report a
server that was down. Its telemetry (config.mlflow-telemetry.io) is off unless the user says.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from fedtune.core.errors import StoreUnavailable
from fedtune.tracking.mlflow_env import BACKOFF_ENV, RETRIES_ENV, TELEMETRY_ENV, TIMEOUT_ENV
from fedtune.tracking.mlflow_tracker import MlflowTracker
from tests.helpers.hung_server import closed_port, hung_server
from tests.integration.crash_helpers import fedtune_env


@pytest.fixture(autouse=True)
def _restore_mlflow_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tracker sets MLflow's variables in this process; put them back afterwards."""
    for name in (TIMEOUT_ENV, RETRIES_ENV, BACKOFF_ENV, TELEMETRY_ENV):
        monkeypatch.setenv(name, os.environ.get(name, ""))
        monkeypatch.delenv(name)


def _start(tracker: MlflowTracker) -> None:
    tracker.start(run_name="r", params={}, tags={})


def test_a_server_that_is_down_fails_within_seconds() -> None:
    uri = closed_port()
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="unreachable or did not answer") as info:
        _start(MlflowTracker(uri, "exp"))
    # Two retries, 1 s and 2 s apart (plus up to 1 s jitter each): far from MLflow's 260 s.
    assert time.monotonic() - started < 30
    assert uri in str(info.value) and "2 retries" in str(info.value)


def test_a_hung_server_fails_within_the_jobs_bound() -> None:
    with hung_server() as uri:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="1 s per request, 0 retries"):
            _start(MlflowTracker(uri, "exp", timeout_s=1, max_retries=0))
        assert time.monotonic() - started < 20  # MLflow's default: 120 s per attempt, 8 tries


def test_telemetry_is_off_and_the_users_settings_win() -> None:
    code = (
        "import os; from fedtune.tracking.mlflow_tracker import MlflowTracker; "
        "MlflowTracker('sqlite:////tmp/x.db', 'e', timeout_s=7); "
        "from mlflow.telemetry.utils import is_telemetry_disabled; "
        "print(os.environ['MLFLOW_HTTP_REQUEST_TIMEOUT'], os.environ['MLFLOW_HTTP_REQUEST_MAX_RETRIES'], "
        "os.environ['MLFLOW_DISABLE_TELEMETRY'], is_telemetry_disabled())"
    )
    env = {k: v for k, v in fedtune_env().items() if not k.startswith(("MLFLOW_", "CI", "PYTEST"))}
    plain = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert plain.stdout.split() == ["7", "2", "true", "True"], plain.stderr
    env["MLFLOW_HTTP_REQUEST_TIMEOUT"] = "99"
    env["MLFLOW_DISABLE_TELEMETRY"] = "false"
    user = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert user.stdout.split()[:3] == ["99", "2", "false"], user.stderr
