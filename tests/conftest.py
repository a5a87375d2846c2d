"""Guards every test gets: what one test sets process-wide must not reach the next.

The suite runs in two worker processes (``make test``), so which tests share a process, and
in what order, changes with the split; a test that leaves a process-wide setting behind makes
another pass or fail by that order alone.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

# Where a later test's MLflow client would go without being told: mlflow's set_tracking_uri
# writes these into os.environ as well as into its own module state.
_PROCESS_WIDE = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")


def _mlflow_uri() -> object:
    if "mlflow" not in sys.modules:
        return None
    from mlflow.tracking._tracking_service import utils

    return utils._tracking_uri


@pytest.fixture(autouse=True)
def _no_process_wide_mlflow_uri_left_behind() -> Iterator[None]:
    before = ({name: os.environ.get(name) for name in _PROCESS_WIDE}, _mlflow_uri())
    yield
    after = ({name: os.environ.get(name) for name in _PROCESS_WIDE}, _mlflow_uri())
    if after != before:
        import mlflow

        mlflow.set_tracking_uri(before[1])  # type: ignore[arg-type]  # None means unset
        for name, value in before[0].items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        pytest.fail(
            f"the test left MLflow's process-wide tracking URI changed ({before} -> {after}); "
            "unset it when done (mlflow.set_tracking_uri(None)) or use monkeypatch.setenv",
            pytrace=False,
        )
