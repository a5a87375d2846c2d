"""The tracking protocol every engine logs through, and the tracker that does nothing.

Algorithms return metrics; engines hand them to a :class:`Tracker`. Only
``fedtune.tracking.mlflow_tracker`` talks to MLflow, so everything else runs (and is
tested) with :class:`NullTracker` when tracking is off.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

RunStatus = Literal["FINISHED", "FAILED", "KILLED"]


@dataclass(frozen=True)
class ModelRef:
    """Where a logged model was registered.

    Attributes:
        model_uri: URI that loads this exact version (``models:/NAME/VERSION`` for MLflow).
        registered_name: The registered model's name.
        version: The registered version (0 when nothing was registered).
        alias: The alias pointing at this version, if one was set.
    """

    model_uri: str
    registered_name: str
    version: int
    alias: str | None


@runtime_checkable
class Tracker(Protocol):
    """What an engine needs from experiment tracking."""

    def start(
        self,
        run_name: str,
        params: dict[str, Any],
        tags: dict[str, str],
        run_id: str | None = None,
    ) -> str:
        """Start a run (or resume ``run_id``), log its params and tags; return the run id."""
        ...

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Log metric values at ``step`` (the round)."""
        ...

    def log_params(self, params: dict[str, Any]) -> None:
        """Log (possibly nested) parameters; secret-looking keys are dropped."""
        ...

    def log_dict(self, obj: dict[str, Any], artifact_file: str) -> None:
        """Store a JSON/YAML-serializable dict as an artifact file of the run."""
        ...

    def log_artifact(self, local_path: Path | str, artifact_path: str | None = None) -> None:
        """Upload a local file or folder to the run's artifacts."""
        ...

    def log_model(
        self,
        model_dir: Path,
        name: str,
        registered_name: str,
        alias: str | None,
        tags: dict[str, str],
    ) -> ModelRef:
        """Log a Hugging Face model directory as a model and register it."""
        ...

    def tag_model_version(self, registered_name: str, version: int, tags: dict[str, str]) -> None:
        """Set ``tags`` on a registered model version (e.g. its audit result)."""
        ...

    def end(self, status: RunStatus) -> None:
        """Close the run with its final status."""
        ...


class NullTracker:
    """A tracker that records nothing; used when tracking is off and in tests."""

    run_id = "null"

    def start(
        self,
        run_name: str,
        params: dict[str, Any],
        tags: dict[str, str],
        run_id: str | None = None,
    ) -> str:
        """Return ``"null"``."""
        return self.run_id

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Do nothing."""

    def log_params(self, params: dict[str, Any]) -> None:
        """Do nothing."""

    def log_dict(self, obj: dict[str, Any], artifact_file: str) -> None:
        """Do nothing."""

    def log_artifact(self, local_path: Path | str, artifact_path: str | None = None) -> None:
        """Do nothing."""

    def log_model(
        self,
        model_dir: Path,
        name: str,
        registered_name: str,
        alias: str | None,
        tags: dict[str, str],
    ) -> ModelRef:
        """Register nothing; the reference points at the local directory, version 0."""
        return ModelRef(
            model_uri=Path(model_dir).resolve().as_uri(),
            registered_name=registered_name,
            version=0,
            alias=alias,
        )

    def tag_model_version(self, registered_name: str, version: int, tags: dict[str, str]) -> None:
        """Do nothing (nothing was registered)."""

    def end(self, status: RunStatus) -> None:
        """Do nothing."""
