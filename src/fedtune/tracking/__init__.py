"""Experiment tracking behind a small protocol; MLflow and do-nothing implementations.

``MlflowTracker`` is imported from ``fedtune.tracking.mlflow_tracker`` on purpose: importing
this package never imports mlflow.
"""

from fedtune.tracking.base import ModelRef, NullTracker, RunStatus, Tracker
from fedtune.tracking.params import flatten, is_secret_key, loggable_params, redact

__all__ = [
    "ModelRef",
    "NullTracker",
    "RunStatus",
    "Tracker",
    "flatten",
    "is_secret_key",
    "loggable_params",
    "redact",
]
