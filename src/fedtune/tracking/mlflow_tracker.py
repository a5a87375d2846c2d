"""The MLflow implementation of :class:`~fedtune.tracking.base.Tracker`.

Only this module and ``mlflow_models.py`` (its model-registry half) import mlflow, lazily
because the import takes seconds; ``hf_pyfunc_model.py`` is the code MLflow itself runs to
load a logged model. All calls go through one explicit ``MlflowClient``, never through
mlflow's process-wide "active run" and URIs.

Tracking URI: the explicit argument, else ``MLFLOW_TRACKING_URI``, else the caller's
``default_uri`` (the local engine passes :func:`local_tracking_uri`). For local work use a
SQLite store: MLflow 3.17 refuses the file store (``./mlruns``) unless
``MLFLOW_ALLOW_FILE_STORE=true`` and keeps it in maintenance mode, while SQLite supports the
model registry and aliases. With a SQLite store, new experiments keep their artifacts in
``mlartifacts/`` beside the database rather than in MLflow's default ``./mlruns`` under
whatever the current directory happens to be.
"""

from __future__ import annotations

import logging
import math
import os
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedtune.core import killpoints
from fedtune.core.errors import ConfigError, StoreError
from fedtune.tracking.base import ModelRef, RunStatus
from fedtune.tracking.digest import CONTENT_TAG, RUN_TAG, folder_sha256
from fedtune.tracking.mlflow_env import bound_mlflow_http
from fedtune.tracking.mlflow_models import (
    check_model_dir,
    download_hf_model,
    find_registered,
    log_hf_model,
    mlflow_errors,
)
from fedtune.tracking.params import is_secret_key, loggable_params, redact
from fedtune.tracking.sqlite_db import ensure_database

if TYPE_CHECKING:
    from mlflow import MlflowClient

logger = logging.getLogger(__name__)

_BATCH = 100  # MLflow's per-request limit on params (metrics allow 1000)
_MAX_KEY = 250  # MLflow's limit on a param/metric key


def local_tracking_uri(workdir: Path) -> str:
    """A SQLite tracking URI for ``<workdir>/mlflow.db`` (absolute, so any cwd works)."""
    return f"sqlite:///{Path(workdir).resolve() / 'mlflow.db'}"


def resolve_tracking_uri(explicit: str | None, default_uri: str | None) -> str:
    """Pick the tracking URI: explicit, else ``MLFLOW_TRACKING_URI``, else ``default_uri``.

    Raises:
        ConfigError: None of the three is set.
    """
    uri = explicit or os.environ.get("MLFLOW_TRACKING_URI") or default_uri
    if not uri:
        raise ConfigError(
            "no MLflow tracking URI: none was given, MLFLOW_TRACKING_URI is unset and the "
            "caller supplied no default",
            fix="Set MLFLOW_TRACKING_URI (e.g. http://mlflow.fedtune:5000 or "
            "sqlite:////abs/path/mlflow.db) or turn tracking off.",
        )
    return uri


class MlflowTracker:
    """Logs runs, metrics, artifacts and models to an MLflow tracking server or local store.

    Args:
        tracking_uri: Explicit tracking URI, or None to use the environment / default.
        experiment: Experiment name; created on first use.
        default_uri: Used when neither ``tracking_uri`` nor ``MLFLOW_TRACKING_URI`` is set.
        timeout_s, max_retries: Bounds of every request to a tracking server (the job's
            ``limits.tracking_*``; see :mod:`fedtune.tracking.mlflow_env`).
    """

    def __init__(
        self,
        tracking_uri: str | None,
        experiment: str,
        *,
        default_uri: str | None = None,
        timeout_s: int = 30,
        max_retries: int = 2,
    ) -> None:
        bound_mlflow_http(timeout_s, max_retries)
        self.tracking_uri = resolve_tracking_uri(tracking_uri, default_uri)
        self.experiment = experiment
        self._client_obj: MlflowClient | None = None
        self._run_id: str | None = None
        self._experiment_id: str | None = None
        self._logged: set[tuple[str, int]] = set()  # (metric key, step) the run already holds

    # -- plumbing ------------------------------------------------------------------------

    @property
    def run_id(self) -> str | None:
        """The id of the current run, or None before :meth:`start` / after :meth:`end`."""
        return self._run_id

    def _client(self) -> MlflowClient:
        if self._client_obj is None:
            from mlflow import MlflowClient
            from mlflow.exceptions import MlflowException

            ensure_database(self.tracking_uri)
            try:
                self._client_obj = MlflowClient(
                    tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri
                )
            except MlflowException as exc:
                raise ConfigError(
                    f"MLflow cannot use the tracking URI {self.tracking_uri!r}: {exc.message}",
                    fix="Use a database store (sqlite:////abs/path/mlflow.db) or an http(s) "
                    "tracking server; MLflow 3 no longer accepts the ./mlruns file store.",
                ) from exc
        return self._client_obj

    def _require_run(self) -> str:
        if self._run_id is None:
            raise StoreError(
                "the MLflow tracker has no active run",
                fix="Call start() before logging, and do not log after end().",
            )
        return self._run_id

    def _mlflow_errors(self, what: str) -> AbstractContextManager[None]:
        return mlflow_errors(self.tracking_uri, what)

    def _experiment_id_for_start(self) -> str:
        client = self._client()
        exp = client.get_experiment_by_name(self.experiment)
        if exp is None:
            artifact_location = None
            if self.tracking_uri.startswith("sqlite:///"):
                db = Path(self.tracking_uri.removeprefix("sqlite:///"))
                artifact_location = (db.parent / "mlartifacts").resolve().as_uri()
            return client.create_experiment(self.experiment, artifact_location=artifact_location)
        if exp.lifecycle_stage == "deleted":
            raise StoreError(
                f"MLflow experiment {self.experiment!r} is deleted",
                fix="Restore it in the MLflow UI (or `mlflow experiments restore`) or use "
                "another experiment name.",
            )
        return str(exp.experiment_id)

    # -- the Tracker protocol -------------------------------------------------------------

    def start(
        self,
        run_name: str,
        params: dict[str, Any],
        tags: dict[str, str],
        run_id: str | None = None,
    ) -> str:
        """Create a run (or resume ``run_id``) and log params and tags.

        Args:
            run_name: Display name of a new run (ignored when resuming).
            params: Possibly nested parameters; flattened, secrets dropped.
            tags: Run tags; secret-looking keys are dropped.
            run_id: An existing run of this experiment to continue.

        Returns:
            The run id.

        Raises:
            StoreError: The run does not exist, belongs to another experiment, or MLflow fails.
        """
        from mlflow.entities import RunTag

        client = self._client()
        with self._mlflow_errors("start a run"):
            self._experiment_id = self._experiment_id_for_start()
            safe_tags = {k: str(v) for k, v in tags.items() if not is_secret_key(k)}
            if run_id is None:
                run = client.create_run(self._experiment_id, run_name=run_name, tags=safe_tags)
                self._run_id = run.info.run_id
                self._logged = set()
            else:
                run = self._existing_run(run_id)
                client.update_run(run_id, status="RUNNING")
                client.log_batch(run_id, tags=[RunTag(k, v) for k, v in safe_tags.items()])
                self._run_id = run_id
                self._logged = {
                    (key, int(m.step))
                    for key in run.data.metrics
                    for m in client.get_metric_history(run_id, key)
                }
        self.log_params(params)
        logger.info("MLflow run %s in experiment %r", self._run_id, self.experiment)
        return self._run_id

    def _existing_run(self, run_id: str) -> Any:
        from mlflow.exceptions import MlflowException

        try:
            run = self._client().get_run(run_id)
        except MlflowException as exc:
            raise StoreError(
                f"cannot resume MLflow run {run_id!r}: {exc.message}",
                fix="Pass the run id printed when the run started, or start a new run.",
            ) from exc
        if run.info.experiment_id != self._experiment_id:
            raise StoreError(
                f"MLflow run {run_id!r} belongs to experiment id {run.info.experiment_id}, "
                f"not to {self.experiment!r} (id {self._experiment_id})",
                fix="Resume with the experiment name the run was started under.",
            )
        return run

    def log_params(self, params: dict[str, Any]) -> None:
        """Log flattened, truncated params; keys suggesting secrets are never logged.

        MLflow params are immutable: on a resumed run, params with unchanged values are
        skipped and changed values are kept as first logged (with a warning).
        """
        from mlflow.entities import Param

        run_id = self._require_run()
        flat = {k: v for k, v in loggable_params(params).items() if len(k) <= _MAX_KEY}
        client = self._client()
        with self._mlflow_errors("log params"):
            existing = client.get_run(run_id).data.params
            changed = sorted(k for k, v in flat.items() if k in existing and existing[k] != v)
            if changed:
                logger.warning(
                    "run %s already has different values for params %s; keeping the first ones",
                    run_id,
                    changed,
                )
            todo = [Param(k, v) for k, v in flat.items() if k not in existing]
            for i in range(0, len(todo), _BATCH):
                client.log_batch(run_id, params=todo[i : i + _BATCH])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Log metric values at ``step``; non-finite values are logged as MLflow stores them.

        Idempotent per (key, step), MLflow's own identity of a metric point: what the run
        already holds at ``step`` (logged before a kill, then again on resume) is not logged
        twice, so a resumed run's history equals an uninterrupted one's.
        """
        from mlflow.entities import Metric

        run_id = self._require_run()
        now = int(time.time() * 1000)
        batch = [
            Metric(key, float(value), now, int(step))
            for key, value in metrics.items()
            if not is_secret_key(key) and len(key) <= _MAX_KEY and (key, int(step)) not in self._logged
        ]
        nonfinite = [m.key for m in batch if not math.isfinite(m.value)]
        if nonfinite:
            logger.warning("non-finite metric values at step %d: %s", step, nonfinite)
        with self._mlflow_errors("log metrics"):
            for i in range(0, len(batch), 1000):
                self._client().log_batch(run_id, metrics=batch[i : i + 1000])
                self._logged.update((m.key, m.step) for m in batch[i : i + 1000])

    def log_dict(self, obj: dict[str, Any], artifact_file: str) -> None:
        """Store ``obj`` (secret-looking keys removed) as JSON or YAML by file extension."""
        run_id = self._require_run()
        with self._mlflow_errors(f"log {artifact_file}"):
            self._client().log_dict(run_id, redact(obj), artifact_file)

    def log_artifact(self, local_path: Path | str, artifact_path: str | None = None) -> None:
        """Upload a file, or a folder's contents, under ``artifact_path``."""
        run_id = self._require_run()
        path = Path(local_path)
        if not path.exists():
            raise StoreError(
                f"cannot log artifact {str(path)!r}: no such file or folder",
                fix="Log artifacts after the step that writes them has finished.",
            )
        with self._mlflow_errors(f"log artifact {path.name}"):
            if path.is_dir():
                self._client().log_artifacts(run_id, str(path), artifact_path)
            else:
                self._client().log_artifact(run_id, str(path), artifact_path)

    def log_model(
        self,
        model_dir: Path,
        name: str,
        registered_name: str,
        alias: str | None,
        tags: dict[str, str],
    ) -> ModelRef:
        """Log a Hugging Face directory as a pyfunc model of this run and register it.

        The model is this package's ``hf_pyfunc_model.py`` (models from code, no pickle) with
        the directory as its ``hf_dir`` artifact and explicit pip requirements. The new
        version gets ``tags`` (the registered model too) and, if given, the ``alias``.
        Idempotent: if this run already registered a model with the same contents (a
        resumed run), that version is returned and nothing new is registered.

        Args:
            model_dir: Folder with ``config.json``, weights, tokenizer files and optionally
                ``adapter/`` (PEFT files applied on top at load time).
            name: Name of the logged model within the run.
            registered_name: Registered model to add a version to (created if missing).
            alias: Alias to point at the new version (e.g. ``candidate``), or None.
            tags: Tags for the registered model and the new version.

        Returns:
            The registered version.

        Raises:
            ModelError: ``model_dir`` is not a Hugging Face model directory.
            ConfigError: ``alias`` is not a valid alias.
            StoreError: MLflow fails to log or register.
        """
        run_id = self._require_run()
        model_dir = Path(model_dir)
        check_model_dir(model_dir, alias)
        safe_tags = {k: str(v) for k, v in tags.items() if not is_secret_key(k)}
        content = folder_sha256(model_dir)
        with self._mlflow_errors(f"log model {name!r}"):
            ref = find_registered(self._client(), registered_name, run_id, content, alias)
            if ref is None:
                ref = log_hf_model(
                    self._client(),
                    experiment_id=self._experiment_id or self._existing_experiment_id(run_id),
                    run_id=run_id,
                    model_dir=model_dir,
                    name=name,
                    registered_name=registered_name,
                    alias=alias,
                    tags=safe_tags,
                    version_tags={RUN_TAG: run_id, CONTENT_TAG: content},
                )
        killpoints.reached("model-registered")
        return ref

    def tag_model_version(self, registered_name: str, version: int, tags: dict[str, str]) -> None:
        """Set ``tags`` on version ``version`` of ``registered_name`` (secret-looking keys dropped).

        Raises:
            StoreError: MLflow fails, or the version does not exist.
        """
        with self._mlflow_errors(f"tag {registered_name} version {version}"):
            for key, value in tags.items():
                if not is_secret_key(key):
                    self._client().set_model_version_tag(registered_name, str(version), key, value)

    def _existing_experiment_id(self, run_id: str) -> str:
        return str(self._client().get_run(run_id).info.experiment_id)

    def end(self, status: RunStatus) -> None:
        """Mark the run FINISHED, FAILED or KILLED; later logging needs a new start()."""
        run_id = self._require_run()
        with self._mlflow_errors("end the run"):
            self._client().set_terminated(run_id, status)
        self._run_id = None

    # -- serving side -------------------------------------------------------------------

    def load_registered(self, name_or_uri: str, dst_dir: Path | None = None) -> Path:
        """Download a registered model and return its Hugging Face directory.

        Args:
            name_or_uri: ``models:/NAME@alias``, ``models:/NAME/VERSION``, ``NAME@alias``,
                ``NAME/VERSION`` or a bare ``NAME`` (its highest version).
            dst_dir: Where to download to (a new temporary folder if None).

        Returns:
            The local folder holding ``config.json``, the weights and tokenizer files.

        Raises:
            StoreError: The model, version or alias does not exist, or the download fails.
            ModelError: The version was not logged by :meth:`log_model`.
        """
        return download_hf_model(self._client(), self.tracking_uri, name_or_uri, dst_dir)
