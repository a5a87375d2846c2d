"""Checks a job must pass before a run stores anything: ``fedtune validate --deep`` and ``run``.

Each check opens what the run will open (the workdir, every tenant's data, the tokenizer,
the model and its LoRA targets, the stores, the tracking server) with short timeouts, and
raises the first problem as the error the run itself would meet, with its exit code.
"""

from __future__ import annotations

import logging
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from fedtune.config.job import JobConfig
from fedtune.config.models import PretrainedModelConfig, TinyModelConfig
from fedtune.core.devices import resolve_device
from fedtune.core.errors import ConfigError, ModelError, StoreError

log = logging.getLogger(__name__)

TRACKING_TIMEOUT_S = 5.0


def check_workdir(job: JobConfig) -> None:
    """The workdir is a folder (or can become one)."""
    path = Path(job.workdir)
    blocking = next((p for p in (path, *path.parents) if p.exists()), None)
    if blocking is not None and not blocking.is_dir():
        raise ConfigError(
            f"workdir {str(path)!r} cannot be a folder: {str(blocking)!r} is a file",
            fix="Point workdir at a folder (or a path that does not exist yet), or move the file.",
        )
    if blocking is not None and not os.access(blocking, os.W_OK | os.X_OK):
        raise ConfigError(
            f"workdir {str(path)!r} is not writable ({str(blocking)!r} denies writing)",
            fix="Point workdir at a folder you can write to.",
        )


def check_summary_path(path: Path) -> None:
    """The run summary can be written at ``path``: not a folder, not below a file."""
    if path.is_dir():
        raise ConfigError(
            f"--summary-json {str(path)!r} is a folder",
            fix=f"Name a file, e.g. {str(path / 'summary.json')!r}.",
        )
    blocking = next((p for p in path.parents if p.exists()), None)
    if blocking is not None and not blocking.is_dir():
        raise ConfigError(
            f"--summary-json {str(path)!r} cannot be written: {str(blocking)!r} is a file",
            fix="Name a file in a folder (or a path whose folders do not exist yet).",
        )


def check_model(job: JobConfig, *, download: bool = False) -> None:
    """The tokenizer loads and the model's skeleton has the LoRA target modules.

    The skeleton is built on PyTorch's meta device: no weights are read or allocated. Every
    hub id of the job must be in the Hugging Face cache; with ``download`` (a run, not
    ``validate --deep``) what is missing is fetched first, unless ``HF_HUB_OFFLINE=1``. A
    model in S3 is left to the store check (its folder is downloaded only by the run).
    """
    import torch

    from fedtune.models.hub import hub_references, local_model_path
    from fedtune.models.lora import _check_targets, resolve_targets
    from fedtune.models.tokenizer import load_tokenizer

    # Every hub id of the job (tenants' models, FedPT's, tokenizers), not only the base model.
    for _, uri in hub_references(job.model_dump()):
        local_model_path(uri, cache_only=not download)
    config = job.model
    # fork_rng: building a tiny model seeds torch's global generator, which the run must
    # find exactly as it would without a preflight (results stay bitwise equal).
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        if isinstance(config, TinyModelConfig):
            from fedtune.training.context import build_model

            model, _ = build_model(config, job.tokenizer)
        elif isinstance(config, PretrainedModelConfig) and not config.uri.startswith("s3://"):
            local = local_model_path(config.uri, cache_only=True)
            model = _skeleton(local, shown=config.uri)
            spec = job.tokenizer if job.tokenizer != "auto" else local.removeprefix("file://")
            load_tokenizer(spec)
        else:
            return
    arch = "gpt2" if getattr(model.config, "model_type", "") == "gpt2" else "llama"
    _check_targets(model, resolve_targets(job.lora.target_modules, arch))


def _skeleton(local: str, *, shown: str) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    from fedtune.models.loading import check_model_dir

    path = Path(local.removeprefix("file://"))
    check_model_dir(path, shown=shown)
    try:
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(
            f"the model config in {shown!r} cannot be built: {exc}",
            fix="Point model.uri at a folder written by save_pretrained (config.json + weights).",
        ) from exc


def check_stores(job: JobConfig) -> None:
    """Every store of the job opens and answers a lookup."""
    from fedtune.engines.layout import RUN_KEY, JobStores

    stores = JobStores(job)
    for what, open_ in [
        ("provider store", stores.provider),
        ("exchange store", stores.exchange_root),
        *[(f"store of tenant {t.name}", lambda t=t: stores.tenant(t)) for t in job.tenants],
    ]:
        try:
            open_().exists(RUN_KEY)
        except StoreError as exc:
            # Its own kind: an outage (exit 12) stays an outage, a bad bucket a store error.
            raise type(exc)(f"the {what} cannot be used: {exc}", fix=exc.fix) from exc


def check_tracking(job: JobConfig, timeout: float = TRACKING_TIMEOUT_S) -> None:
    """The tracking store is reachable: a complete SQLite file, or a server that answers."""
    if job.tracking.backend == "none":
        return
    from fedtune.tracking.sqlite_db import check_complete, sqlite_path

    uri = job.tracking.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri is None:
        uri = f"sqlite:///{Path(job.workdir).resolve() / 'mlflow.db'}"
    path = sqlite_path(uri)
    if path is not None:
        if path.exists():
            check_complete(path)
        return
    if not uri.startswith(("http://", "https://")):
        return  # other MLflow stores (databases) are checked by MLflow when the run starts
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (http(s) only)
            response.read(64)
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise StoreError(
            f"the MLflow tracking server {uri!r} does not answer ({url}: {reason}; waited at "
            f"most {timeout:.0f} s)",
            fix="Start the server or correct tracking.tracking_uri / MLFLOW_TRACKING_URI; "
            "set tracking.backend: none to run without tracking.",
        ) from exc


def run_checks(job: JobConfig, *, tenants: Any = None, download: bool = False) -> list[str]:
    """Every check, in the order a run meets them; ``tenants`` also reads every dataset, and
    ``download`` fetches hub models missing from the cache (:func:`check_model`).

    Returns warnings about data that will train poorly (see ``local.data_warnings``).
    """
    resolve_device(job.training)
    check_workdir(job)
    check_stores(job)
    warnings: list[str] = []
    if tenants is not None:
        from fedtune.engines.local import preflight

        warnings = preflight(tenants)
    check_model(job, download=download)
    check_tracking(job)
    return warnings
