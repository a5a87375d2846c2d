"""The MLflow model registry as promotion and local serving need it (this package's one
mlflow import, done lazily because it takes seconds).

Every call goes through one ``MlflowClient`` bound to the given tracking URI: mlflow's fluent
functions read process-wide URIs, which a library must not rewrite. The tracking URI is the
explicit one, else ``MLFLOW_TRACKING_URI``, else the quickstart's ``.fedtune/mlflow.db``.
Before any MLflow call the store is checked (an HTTP server must answer ``/health``, a SQLite
file must exist), so a wrong URI fails in a moment with a clear message instead of after
MLflow's retries, and never creates an empty database.
"""

from __future__ import annotations

import logging
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedtune.core.errors import ModelError, StoreError
from fedtune.serving.refs import ModelSpec
from fedtune.tracking.mlflow_tracker import local_tracking_uri, resolve_tracking_uri

if TYPE_CHECKING:
    from mlflow import MlflowClient

log = logging.getLogger(__name__)

HF_ARTIFACT = "hf_dir"  # the artifact key MlflowTracker.log_model stores the HF directory under
PROXY_ARTIFACT = "proxy_dir"  # FedPT's composite (fedtune.tracking.proxy_pyfunc_model)
HEALTH_TIMEOUT_S = 5.0
QUICKSTART_DIR = Path(".fedtune")


@dataclass(frozen=True)
class VersionRecord:
    """One registered model version as promotion sees it."""

    name: str
    version: int
    location: str  # where its files are: the logged model's artifact location
    tags: dict[str, str] = field(default_factory=dict)
    model_tags: dict[str, str] = field(default_factory=dict)
    aliases: dict[str, int] = field(default_factory=dict)  # of the registered model


def check_reachable(uri: str) -> None:
    """Fail fast unless the tracking store at ``uri`` can be used.

    Raises:
        StoreError: An HTTP server does not answer, or a SQLite file does not exist.
    """
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=HEALTH_TIMEOUT_S):
                pass
        except urllib.error.HTTPError:
            pass  # it answered; authentication and routing are MLflow's business
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise StoreError(
                f"cannot reach the MLflow tracking server at {uri!r}: {reason}",
                fix="Check the URL (--tracking-uri or MLFLOW_TRACKING_URI) and that the server "
                "is up, e.g. `kubectl -n fedtune port-forward svc/fedtune-mlflow 5000`.",
            ) from None
    elif uri.startswith("sqlite:///"):
        path = Path(uri.removeprefix("sqlite:///"))
        if not path.is_file():
            raise StoreError(
                f"there is no MLflow database at {str(path)!r} (tracking URI {uri!r})",
                fix="Run a job with MLflow tracking first (`fedtune run job.yaml`), or point "
                "--tracking-uri / MLFLOW_TRACKING_URI at the store that holds the model.",
            )


class ModelRegistry:
    """Read versions, move aliases, fetch files of registered models.

    Args:
        tracking_uri: The tracking (and registry) URI, already resolved.
    """

    def __init__(self, tracking_uri: str) -> None:
        self.tracking_uri = tracking_uri
        self._client_obj: MlflowClient | None = None

    @classmethod
    def connect(cls, explicit_uri: str | None) -> ModelRegistry:
        """Resolve the tracking URI (explicit, environment, quickstart) and check it."""
        uri = resolve_tracking_uri(explicit_uri, local_tracking_uri(QUICKSTART_DIR))
        check_reachable(uri)
        return cls(uri)

    def _client(self) -> MlflowClient:
        if self._client_obj is None:
            from fedtune.tracking.mlflow_env import bound_mlflow_http

            bound_mlflow_http()  # before mlflow's import: its telemetry starts there
            from mlflow import MlflowClient

            with self._errors("connect"):
                self._client_obj = MlflowClient(
                    tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri
                )
        return self._client_obj

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        from mlflow.exceptions import MlflowException

        try:
            yield
        except MlflowException as exc:
            raise StoreError(
                f"MLflow failed to {what} at {self.tracking_uri!r}: {exc.message}",
                fix="Check the tracking URI, the names, and your MLflow credentials "
                "(MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD).",
            ) from exc

    # -- versions --------------------------------------------------------------------------

    def _registered(self, name: str) -> Any:
        from mlflow.exceptions import MlflowException

        client = self._client()
        try:
            return client.get_registered_model(name)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
        with self._errors("list registered models"):
            known = sorted(m.name for m in client.search_registered_models(max_results=20))
        raise StoreError(
            f"there is no registered model {name!r} at {self.tracking_uri!r}",
            fix=f"Use one of the registered models {known}."
            if known
            else "Nothing is "
            "registered there yet: run a job with MLflow tracking, or check --tracking-uri.",
        )

    def version(self, spec: ModelSpec) -> VersionRecord:
        """Look up the version ``spec`` names (by number or alias).

        Raises:
            StoreError: The model, version or alias does not exist, or MLflow fails.
        """
        with self._errors(f"look up {spec}"):
            model = self._registered(spec.name)
            aliases = {str(k): int(v) for k, v in dict(model.aliases or {}).items()}
            if spec.alias is not None:
                if spec.alias not in aliases:
                    raise StoreError(
                        f"registered model {spec.name!r} has no alias {spec.alias!r}",
                        fix=f"Use one of its aliases {sorted(aliases)}, or promote a version "
                        f"first: fedtune promote {spec.name} --version N --alias {spec.alias}",
                    )
                number = aliases[spec.alias]
            else:
                number = int(spec.version or 0)
            known = self._version_numbers(spec.name)
            if number not in known:
                raise StoreError(
                    f"registered model {spec.name!r} has no version {number}",
                    fix=f"Use one of its versions {known}.",
                )
            mv = self._client().get_model_version(spec.name, str(number))
            return VersionRecord(
                name=spec.name,
                version=number,
                location=self._location(spec.name, number),
                tags={str(k): str(v) for k, v in dict(mv.tags or {}).items()},
                model_tags={str(k): str(v) for k, v in dict(model.tags or {}).items()},
                aliases=aliases,
            )

    def _version_numbers(self, name: str) -> list[int]:
        escaped = name.replace("'", "\\'")
        found = self._client().search_model_versions(f"name = '{escaped}'")
        return sorted(int(v.version) for v in found)

    def _location(self, name: str, version: int) -> str:
        client = self._client()
        location = str(client.get_model_version_download_uri(name, str(version)))
        if location.startswith("models:/"):
            # A version registered from "models:/<model_id>": its files live where the
            # logged model keeps its artifacts.
            location = str(
                client.get_logged_model(location.removeprefix("models:/")).artifact_location
            )
        return location.rstrip("/")

    def set_alias(self, name: str, alias: str, version: int) -> None:
        """Point ``alias`` at ``version`` (moving it from whichever version had it)."""
        with self._errors(f"set alias {alias!r} of {name!r}"):
            self._client().set_registered_model_alias(name, alias, str(version))

    # -- files -----------------------------------------------------------------------------

    def read_text(self, location: str, relpath: str) -> str | None:
        """Text of the file ``relpath`` under ``location``, or None when it does not exist."""
        import mlflow.artifacts

        parent, _, leaf = relpath.rpartition("/")
        base = f"{location}/{parent}" if parent else location
        with self._errors(f"list {base}"):
            names = {
                Path(info.path).name
                for info in mlflow.artifacts.list_artifacts(
                    artifact_uri=base, tracking_uri=self.tracking_uri
                )
                if not info.is_dir
            }
        if leaf not in names:
            return None
        with (
            tempfile.TemporaryDirectory(prefix="fedtune-artifact-") as tmp,
            self._errors(f"download {base}/{leaf}"),
        ):
            local = mlflow.artifacts.download_artifacts(
                artifact_uri=f"{base}/{leaf}", dst_path=tmp, tracking_uri=self.tracking_uri
            )
            return Path(local).read_text(encoding="utf-8")

    def hf_subpath(self, record: VersionRecord) -> str:
        """Where the Hugging Face directory sits inside the version's files.

        Raises:
            ModelError: The version was not logged by fedtune's tracker.
        """
        import yaml

        text = self.read_text(record.location, "MLmodel")
        flavor = (
            (yaml.safe_load(text) or {}).get("flavors", {}).get("python_function", {})
            if text
            else {}
        )
        path = flavor.get("artifacts", {}).get(HF_ARTIFACT, {}).get("path")
        if not path and PROXY_ARTIFACT in flavor.get("artifacts", {}):
            raise ModelError(
                f"{record.name} version {record.version} is a FedPT proxy-tuned composite (a "
                "large model, a small model and an adapter decoded together), which a KServe "
                "Hugging Face runtime cannot serve",
                fix=f"Serve it with `fedtune serve-local {record.name}/{record.version}`, or "
                f"promote the small model, registered as {record.name}-small.",
            )
        if not path:
            raise ModelError(
                f"{record.name} version {record.version} holds no Hugging Face directory "
                f"artifact {HF_ARTIFACT!r} ({record.location})",
                fix="Promote and serve models that fedtune registered (MlflowTracker.log_model).",
            )
        return str(path).strip("/")

    def download_hf_dir(self, spec: ModelSpec, dst: Path) -> Path:
        """Download the version ``spec`` names; return its Hugging Face directory in ``dst``.

        Raises:
            StoreError: The model, version or alias does not exist, or the download fails.
            ModelError: The version holds no Hugging Face directory (not logged by fedtune,
                or a FedPT proxy-tuned composite).
        """
        from fedtune.tracking.mlflow_models import download_hf_model

        return download_hf_model(self._client(), self.tracking_uri, str(spec), dst)

    def download(self, record: VersionRecord, dst: Path) -> Path:
        """Download every file of the version into ``dst``; return the local model folder."""
        import mlflow.artifacts

        dst.mkdir(parents=True, exist_ok=True)
        with self._errors(f"download {record.name} version {record.version}"):
            return Path(
                mlflow.artifacts.download_artifacts(
                    artifact_uri=record.location, dst_path=str(dst), tracking_uri=self.tracking_uri
                )
            )


def load_pyfunc(model_dir: Path) -> Any:
    """Load a downloaded fedtune model through MLflow's pyfunc flavor (runs its model code).

    Raises:
        ModelError: MLflow or the model's code cannot load it.
    """
    import mlflow.pyfunc
    from mlflow.exceptions import MlflowException

    try:
        return mlflow.pyfunc.load_model(str(model_dir))
    except (MlflowException, OSError, ValueError, ImportError) as exc:
        raise ModelError(
            f"cannot load the model in {str(model_dir)!r}: {exc}",
            fix="Check that the serving environment has the model's requirements "
            "(requirements.txt beside MLmodel) and that the version was logged by fedtune.",
        ) from exc
