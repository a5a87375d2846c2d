"""MLflow's environment settings fedtune chooses before it talks to a tracking server.

MLflow reads its HTTP behaviour only from environment variables. Its defaults retry a failed
request 7 times with doubling back-off and wait 120 s per answer, so an unreachable server
took over four minutes to fail; fedtune bounds both (the job's ``limits.tracking_*``). It
also turns MLflow's usage telemetry off (MLflow 3 sends it to config.mlflow-telemetry.io),
which nobody running fedtune asked for. Whatever the user set in the environment wins.
"""

from __future__ import annotations

import os

TIMEOUT_ENV = "MLFLOW_HTTP_REQUEST_TIMEOUT"
RETRIES_ENV = "MLFLOW_HTTP_REQUEST_MAX_RETRIES"
BACKOFF_ENV = "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"
TELEMETRY_ENV = "MLFLOW_DISABLE_TELEMETRY"

#: The variables the user set before fedtune started: fedtune never overrides those.
_USER_SET = frozenset(
    name for name in (TIMEOUT_ENV, RETRIES_ENV, BACKOFF_ENV, TELEMETRY_ENV) if name in os.environ
)


def bound_mlflow_http(timeout_s: int = 30, max_retries: int = 2) -> None:
    """Set MLflow's per-request timeout and retries (1 s, 2 s, ... apart); no telemetry."""
    chosen = {
        TIMEOUT_ENV: str(timeout_s),
        RETRIES_ENV: str(max_retries),
        BACKOFF_ENV: "1",
        TELEMETRY_ENV: "true",
    }
    for name, value in chosen.items():
        if name not in _USER_SET:
            os.environ[name] = value
