"""Build the tracker a job asks for (shared by the CLI, the engines and the entrypoints)."""

from __future__ import annotations

from pathlib import Path

from fedtune.config.job import JobConfig
from fedtune.tracking.base import NullTracker, Tracker


def make_tracker(job: JobConfig) -> Tracker:
    """The job's tracker: MLflow (default URI: SQLite in the workdir) or none."""
    if job.tracking.backend == "none":
        return NullTracker()
    from fedtune.tracking.mlflow_tracker import MlflowTracker, local_tracking_uri

    return MlflowTracker(
        job.tracking.tracking_uri,
        job.tracking.experiment,
        default_uri=local_tracking_uri(Path(job.workdir)),
        timeout_s=job.limits.tracking_timeout_s,
        max_retries=job.limits.tracking_max_retries,
    )
