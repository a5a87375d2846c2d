"""Hugging Face model directories in and out of the MLflow 3 model registry.

The model half of :class:`~fedtune.tracking.mlflow_tracker.MlflowTracker` (which is the only
other module that imports mlflow, lazily). A model directory is logged as a pyfunc "models
from code" model: ``hf_pyfunc_model.py`` plus the directory as its ``hf_dir`` artifact, with
explicit pip requirements (MLflow would otherwise try to pin torchvision) and no pickle. The
LoggedModel is linked to the run, registered under a name, tagged, and aliased (the registry
uses aliases; stages are deprecated).

Everything goes through an explicit ``MlflowClient``: mlflow's fluent ``log_model`` and
``register_model`` read process-wide URIs (``set_tracking_uri`` also rewrites environment
variables) and need the run to be the process's active run.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedtune.core import killpoints
from fedtune.core.errors import ConfigError, ModelError, StoreError, StoreUnavailable
from fedtune.tracking.base import ModelRef
from fedtune.tracking.mlflow_env import RETRIES_ENV, TIMEOUT_ENV

if TYPE_CHECKING:
    from mlflow import MlflowClient

logger = logging.getLogger(__name__)

MODEL_CODE = Path(__file__).with_name("hf_pyfunc_model.py")
HF_ARTIFACT = "hf_dir"  # must match HF_ARTIFACT in hf_pyfunc_model.py
PROXY_MODEL_CODE = Path(__file__).with_name("proxy_pyfunc_model.py")
PROXY_ARTIFACT = "proxy_dir"  # must match PROXY_ARTIFACT in proxy_pyfunc_model.py
PROXY_MANIFEST = "fedpt.json"  # FedPT's composite (fedtune.algorithms.fedpt.algorithm)
_ALIAS = re.compile(r"^[A-Za-z0-9_\-]{1,255}$")
_VERSION_LIKE = re.compile(r"^[vV]\d+$")  # MLflow reserves v<number> for versions


@contextmanager
def mlflow_errors(tracking_uri: str, what: str) -> Iterator[None]:
    """Turn MLflow's exceptions into :class:`StoreError` naming the action and the store."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as exc:
        if any(sign in exc.message for sign in _OUTAGE_SIGNS):
            raise StoreUnavailable(
                f"the MLflow tracking server {tracking_uri!r} is unreachable or did not answer "
                f"(trying to {what}; {os.environ.get(TIMEOUT_ENV, '?')} s per request, "
                f"{os.environ.get(RETRIES_ENV, '?')} retries): {exc.message[:300]}",
                fix="Start the server or correct tracking.tracking_uri / MLFLOW_TRACKING_URI; "
                "a slow server needs larger limits.tracking_timeout_s; then run again with "
                "--resume.",
            ) from exc
        raise StoreError(
            f"MLflow failed to {what} at {tracking_uri!r}: {exc.message}",
            fix="Check that the tracking server is reachable and the names are valid.",
        ) from exc


# What MLflow's message says when the server never answered (requests / urllib3 wording).
_OUTAGE_SIGNS = ("Max retries exceeded", "timed out", "Connection refused", "ConnectionError")


def _requirement(package: str) -> str:
    # Pin what is installed here, minus local build tags such as "+cpu", so that a GPU
    # serving image resolves its own build of the same release.
    version = importlib.metadata.version(package).split("+", 1)[0]
    return f"{package}=={version}"


def model_requirements(with_peft: bool) -> list[str]:
    """Explicit pip requirements of a logged model, pinned to the installed releases."""
    packages = ["mlflow", "torch", "transformers", "tokenizers", "safetensors"]
    if with_peft:
        packages.append("peft")
    return [_requirement(p) for p in packages]


def _signature() -> Any:
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    return ModelSignature(
        inputs=Schema([ColSpec("string", "prompt")]),
        outputs=Schema([ColSpec("string")]),
        params=ParamSchema([ParamSpec("max_new_tokens", "long", 64)]),
    )


def is_proxy_dir(model_dir: Path) -> bool:
    """A FedPT proxy-tuned composite (manifest, ``large/``, ``small/``), not one HF directory."""
    return (model_dir / PROXY_MANIFEST).is_file()


def _model_code(model_dir: Path, tmp: Path) -> dict[str, Any]:
    """``save_model`` arguments of the model code that loads ``model_dir``."""
    # The prompt framing (and FedPT's decoding routine) travel with the model under names
    # that cannot clash with the serving image's own modules.
    from fedtune.models import prompt_frame

    code = tmp / "code"
    code.mkdir(parents=True)
    frame = code / prompt_frame.SHIPPED_NAME
    frame.write_text(Path(prompt_frame.__file__).read_text())
    if not is_proxy_dir(model_dir):
        with_peft = (model_dir / "adapter" / "adapter_config.json").is_file()
        return {
            "python_model": str(MODEL_CODE),
            "artifacts": {HF_ARTIFACT: str(model_dir)},
            "pip_requirements": model_requirements(with_peft),
            "code_paths": [str(frame)],
        }
    from fedtune.models import proxy_decoding as decoding

    shipped = code / "fedtune_fedpt_decoding.py"
    shipped.write_text(Path(decoding.__file__).read_text())
    return {
        "python_model": str(PROXY_MODEL_CODE),
        "artifacts": {PROXY_ARTIFACT: str(model_dir)},
        "pip_requirements": model_requirements(with_peft=True),
        "code_paths": [str(shipped), str(frame)],
    }


def check_model_dir(model_dir: Path, alias: str | None) -> None:
    """Fail early, before anything is written to MLflow.

    Raises:
        ModelError: ``model_dir`` has no ``config.json``.
        ConfigError: ``alias`` is not a valid MLflow alias.
    """
    if not is_proxy_dir(model_dir) and not (model_dir / "config.json").is_file():
        raise ModelError(
            f"{str(model_dir)!r} is not a Hugging Face model directory (no config.json)",
            fix="Export the model with save_pretrained() (and the tokenizer beside it) "
            "before logging it.",
        )
    if alias is not None and (not _ALIAS.match(alias) or _VERSION_LIKE.match(alias)):
        raise ConfigError(
            f"invalid model alias {alias!r}",
            fix="Use letters, digits, '_' or '-' (not of the form v<number>), e.g. candidate.",
        )


def log_hf_model(
    client: MlflowClient,
    *,
    experiment_id: str,
    run_id: str,
    model_dir: Path,
    name: str,
    registered_name: str,
    alias: str | None,
    tags: dict[str, str],
    version_tags: dict[str, str] | None = None,
) -> ModelRef:
    """Log ``model_dir`` as a LoggedModel of ``run_id``, register it, tag and alias it.

    Args:
        client: Client of the tracking store (also used as the registry).
        experiment_id: The run's experiment.
        run_id: The run the model is an output of.
        model_dir: A checked Hugging Face directory (see :func:`check_model_dir`).
        name: Name of the logged model within the run.
        registered_name: Registered model to add a version to (created if missing).
        alias: Alias to point at the new version, or None.
        tags: Tags (already free of secrets) for the registered model and the version.
        version_tags: Tags for the new version only (what identifies this export).

    Returns:
        The registered version.
    """
    import mlflow.pyfunc
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus
    from mlflow.models import Model

    logged = unregistered_logged_model(client, experiment_id, run_id, name)
    if logged is None:
        logged = client.create_logged_model(
            experiment_id=experiment_id, name=name, source_run_id=run_id, tags=tags
        )
    elif tags:
        client.set_logged_model_tags(logged.model_id, tags)
    with tempfile.TemporaryDirectory(prefix="fedtune-mlmodel-") as tmp:
        local = Path(tmp) / "model"
        with warnings.catch_warnings():
            # No input example on purpose: MLflow would load and run the model while
            # logging it (minutes for a real LLM); the explicit signature suffices.
            warnings.filterwarnings("ignore", message=".*An input example was not")
            mlflow.pyfunc.save_model(
                path=str(local),
                **_model_code(model_dir, Path(tmp)),
                signature=_signature(),
                mlflow_model=Model(
                    artifact_path=logged.artifact_location,
                    model_uuid=logged.model_id,
                    run_id=run_id,
                    model_id=logged.model_id,
                ),
            )
        client.log_model_artifacts(logged.model_id, str(local))
    killpoints.reached("model-uploaded")  # still pending: the kill the resume must not orphan
    client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
    outputs = client.get_run(run_id).outputs
    if logged.model_id not in {o.model_id for o in (outputs.model_outputs if outputs else [])}:
        client.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step=0)])
    version = _register(client, registered_name, logged, run_id, tags, alias, version_tags or {})
    logger.info("registered %s version %d (alias %s)", registered_name, version, alias)
    return ModelRef(
        model_uri=f"models:/{registered_name}/{version}",
        registered_name=registered_name,
        version=version,
        alias=alias,
    )


def unregistered_logged_model(
    client: MlflowClient, experiment_id: str, run_id: str, name: str
) -> Any | None:
    """The logged model ``name`` of ``run_id`` that no registered version points to, if any.

    A run killed between logging its model and registering it left one (pending or ready);
    the resumed run logs into it again rather than leave it orphaned beside a second one.
    Versions are matched by source (the logged model's artifact location): the SQL
    registry does not keep a version's ``model_id``.
    """
    logged = client.search_logged_models(
        [experiment_id],
        filter_string=f"source_run_id = '{run_id}' AND name = '{name}'",
        order_by=[{"field_name": "creation_timestamp", "ascending": True}],
    )
    if not logged:
        return None
    sources = {str(v.source) for v in client.search_model_versions(f"run_id = '{run_id}'")}
    orphans = [m for m in logged if str(m.artifact_location) not in sources]
    if not orphans:
        return None
    logger.info("reusing logged model %s of run %s, which no version points to", orphans[0].model_id, run_id)
    return orphans[0]


def find_registered(
    client: MlflowClient, name: str, run_id: str, content_sha256: str, alias: str | None
) -> ModelRef | None:
    """The version of ``name`` that ``run_id`` already registered with these exact contents.

    A resumed run (after a kill following registration, or once finished) gets that version
    back instead of a new one; its alias is set only if the model has none of that name yet
    (a kill between registering and aliasing), so an alias moved since stays where it is.
    """
    from mlflow.exceptions import MlflowException

    from fedtune.tracking.digest import CONTENT_TAG

    try:
        versions = client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    found = [v for v in versions if (v.tags or {}).get(CONTENT_TAG) == content_sha256]
    if not found:
        return None
    version = min(int(v.version) for v in found)
    if alias is not None and alias not in (client.get_registered_model(name).aliases or {}):
        client.set_registered_model_alias(name, alias, str(version))
    logger.info("%s version %d already holds this run's model: not registered again", name, version)
    return ModelRef(f"models:/{name}/{version}", name, version, alias)


def _register(
    client: MlflowClient,
    name: str,
    logged: Any,
    run_id: str,
    tags: dict[str, str],
    alias: str | None,
    version_tags: dict[str, str],
) -> int:
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name, tags=tags)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        for key, value in tags.items():
            client.set_registered_model_tag(name, key, value)
    # The source is the logged model's artifact location, not "models:/<model_id>": the SQL
    # registry store resolves the latter through the process-wide tracking URI (a default
    # ./mlflow.db), not through this client's.
    mv = client.create_model_version(
        name,
        source=str(logged.artifact_location),
        run_id=run_id,
        tags={**tags, **version_tags},
        model_id=str(logged.model_id),
    )
    if alias is not None:
        client.set_registered_model_alias(name, alias, mv.version)
    return int(mv.version)


def download_hf_model(
    client: MlflowClient, tracking_uri: str, name_or_uri: str, dst_dir: Path | None = None
) -> Path:
    """Download a registered model version and return its Hugging Face directory.

    Args:
        client: Client of the tracking store / registry.
        tracking_uri: The same store's URI (for resolving ``mlflow-artifacts:`` locations).
        name_or_uri: ``models:/NAME@alias``, ``models:/NAME/VERSION``, ``NAME@alias``,
            ``NAME/VERSION`` or a bare ``NAME`` (its highest version).
        dst_dir: Where to download to (a new temporary folder if None).

    Returns:
        The local folder holding ``config.json``, the weights and tokenizer files.

    Raises:
        StoreError: The model, version or alias does not exist, or the download fails.
        ModelError: The version was not logged by :func:`log_hf_model`.
    """
    import mlflow.artifacts
    from mlflow.models import Model

    ref = name_or_uri.removeprefix("models:/")
    with mlflow_errors(tracking_uri, f"find registered model {name_or_uri!r}"):
        if "@" in ref:
            name, alias = ref.split("@", 1)
            mv = client.get_model_version_by_alias(name, alias)
        elif "/" in ref:
            name, version = ref.split("/", 1)
            mv = client.get_model_version(name, version)
        else:
            versions = client.search_model_versions(f"name = '{ref}'")
            if not versions:
                raise StoreError(
                    f"registered model {ref!r} has no versions",
                    fix="Check the name on the Models page of the MLflow UI.",
                )
            mv = max(versions, key=lambda v: int(v.version))
        # The SQL registry does not keep a version's model_id; its download URI (the logged
        # model's artifact location) is what every backend keeps.
        location = client.get_model_version_download_uri(mv.name, mv.version)
        if location.startswith("models:/"):
            location = client.get_logged_model(location.removeprefix("models:/")).artifact_location
        dst = Path(dst_dir) if dst_dir is not None else Path(tempfile.mkdtemp(prefix="fedtune-"))
        dst.mkdir(parents=True, exist_ok=True)
        local = Path(
            mlflow.artifacts.download_artifacts(
                artifact_uri=location,
                dst_path=str(dst),
                tracking_uri=tracking_uri,
                registry_uri=tracking_uri,
            )
        )
    flavor = Model.load(str(local)).flavors.get("python_function", {})
    artifact = flavor.get("artifacts", {}).get(HF_ARTIFACT, {})
    hf_dir = local / str(artifact.get("path", ""))
    if not artifact or not (hf_dir / "config.json").is_file():
        raise ModelError(
            f"{name_or_uri!r} holds no Hugging Face directory artifact {HF_ARTIFACT!r}",
            fix="Load models that fedtune registered with MlflowTracker.log_model.",
        )
    return hf_dir
