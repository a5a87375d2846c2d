"""The KServe InferenceService of a promoted model version, as plain data.

KServe's storage initializer copies ``storageUri`` into ``/mnt/models`` of the predictor, and
the Hugging Face runtime (vLLM backend on GPUs) serves the directory it finds there. So the
URI must be the *physical* location of the version's Hugging Face directory in the object
store: a ``models:/`` URI or MLflow's proxied ``mlflow-artifacts:`` scheme mean nothing to
KServe, and a ``file://`` path on the machine that trained the model is unreachable from a
cluster. :func:`physical_storage_uri` does that translation.

fedtune exports un-merged base weights at the top level, the adapter in ``adapter/`` and,
when the job sets ``export.merged``, a merged copy in ``merged/``. By default the manifest
serves ``merged/`` (see
``promotion.served_model``). With ``lora=True`` it serves the base with the adapter through
vLLM's LoRA support (``--enable-lora --lora-modules NAME-lora=/mnt/models/adapter``), which
vLLM offers for Llama-architecture models only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import yaml

from fedtune.config.base import check_dns1123_label
from fedtune.core.errors import ConfigError, ModelError

MOUNT = "/mnt/models"  # where KServe's storage initializer puts storageUri
ADAPTER_SUBDIR = "adapter"
LORA_MODEL_TYPES = frozenset({"llama"})
PHYSICAL_SCHEMES = ("s3", "gs", "https")
# vLLM accepts only these --max-lora-rank values and defaults to 16.
_VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
_DEFAULT_RESOURCES: dict[str, dict[str, str]] = {
    "requests": {"cpu": "2", "memory": "16Gi"},
    "limits": {"cpu": "4", "memory": "24Gi"},
}


@dataclass(frozen=True)
class ServedModel:
    """What the manifest needs to know about one registered version.

    Attributes:
        registered_name: Name in the model registry.
        version: The version number.
        alias: The alias it is promoted to.
        storage_uri: Physical URI of its Hugging Face directory.
        model_type: ``model_type`` from its ``config.json`` (e.g. ``llama``, ``gpt2``).
        lora_rank: ``r`` of the adapter in ``adapter/``, or None when there is none.
        audit: The memorization audit value, when the version has one.
    """

    registered_name: str
    version: int
    alias: str
    storage_uri: str
    model_type: str | None
    lora_rank: int | None = None
    audit: float | None = None


@dataclass(frozen=True)
class KServeOptions:
    """Deployment choices that the registry does not know.

    Attributes:
        name: InferenceService name (DNS-1123 label); default ``<model>-<alias>``.
        namespace: Namespace; None leaves it to ``kubectl apply -n``.
        runtime: ServingRuntime name; None lets KServe pick one for the huggingface format.
        service_account: Predictor ServiceAccount that links the storage credentials.
        gpus: ``nvidia.com/gpu`` per predictor (0 for a CPU-only predictor).
        lora: Also serve the adapter with vLLM's LoRA support (Llama-architecture only).
        run_as_user: Non-root user id of the predictor.
    """

    name: str | None = None
    namespace: str | None = None
    runtime: str | None = None
    service_account: str | None = None
    gpus: int = 1
    lora: bool = False
    run_as_user: int = 1000


def physical_storage_uri(location: str, artifacts_destination: str | None = None) -> str:
    """Translate a registry download URI into one KServe's storage initializer can fetch.

    Args:
        location: The version's download URI (its logged model's artifact location).
        artifacts_destination: The tracking server's ``--artifacts-destination``, needed when
            the server proxies artifacts (``mlflow-artifacts:`` URIs).

    Returns:
        An ``s3://``, ``gs://`` or ``https://`` URI, without a trailing slash.

    Raises:
        ConfigError: The location is local, proxied without a destination, or of a scheme
            KServe cannot fetch.
    """
    scheme = urlsplit(location).scheme
    if scheme in PHYSICAL_SCHEMES:
        return location.rstrip("/")
    if scheme == "mlflow-artifacts":
        if not artifacts_destination:
            raise ConfigError(
                f"the model's artifacts are proxied by the tracking server ({location!r}); "
                "KServe needs their object-store location",
                fix="Pass --artifacts-destination with the server's --artifacts-destination, "
                "e.g. s3://fedtune-mlflow/artifacts (the chart's objectStore.artifactsBucket "
                "and artifactsPrefix).",
            )
        dest_scheme = urlsplit(artifacts_destination).scheme
        if dest_scheme not in PHYSICAL_SCHEMES:
            raise ConfigError(
                f"--artifacts-destination {artifacts_destination!r} is not an object-store URI",
                fix=f"Use a URI with one of the schemes {', '.join(PHYSICAL_SCHEMES)}.",
            )
        path = urlsplit(location).path.lstrip("/")
        return f"{artifacts_destination.rstrip('/')}/{path}".rstrip("/")
    if scheme in ("", "file"):
        raise ConfigError(
            f"the model's artifacts are on this machine's disk ({location!r}); a KServe "
            "predictor in a cluster cannot fetch them",
            fix="Promote from a tracking server whose artifacts live in an object store (the "
            "chart's MLflow), or log to an experiment whose artifact_location is s3://...",
        )
    raise ConfigError(
        f"KServe cannot fetch model artifacts from {location!r} (scheme {scheme!r})",
        fix=f"Keep MLflow artifacts under one of the schemes {', '.join(PHYSICAL_SCHEMES)}.",
    )


def default_name(registered_name: str, alias: str) -> str:
    """``<model>-<alias>`` made into a DNS-1123 label (lowercase, ``-`` for anything else).

    Raises:
        ConfigError: Nothing usable is left of the names.
    """
    raw = re.sub(r"[^a-z0-9-]+", "-", f"{registered_name}-{alias}".lower())
    name = re.sub(r"-{2,}", "-", raw)[:63].strip("-")
    if not name:
        raise ConfigError(
            f"cannot derive an InferenceService name from {registered_name!r}@{alias!r}",
            fix="Pass --isvc-name with a DNS-1123 label, e.g. --isvc-name chat-model.",
        )
    return name


def _dns_label(value: str, option: str) -> str:
    try:
        return check_dns1123_label(value)
    except ValueError as exc:
        raise ConfigError(f"{option}: {exc}", fix=f"Pass a DNS-1123 label as {option}.") from None


def _max_lora_rank(rank: int) -> int:
    for allowed in _VLLM_LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise ModelError(
        f"the adapter's LoRA rank {rank} exceeds vLLM's largest --max-lora-rank "
        f"({_VLLM_LORA_RANKS[-1]})",
        fix="Serve the merged weights without --lora, or retrain with a smaller lora.r.",
    )


def _lora_args(model: ServedModel, served_name: str) -> list[str]:
    if model.model_type not in LORA_MODEL_TYPES:
        raise ConfigError(
            f"--lora: vLLM serves LoRA adapters for Llama-architecture models, and "
            f"{model.registered_name} version {model.version} is {model.model_type!r}",
            fix="Serve the merged weights (drop --lora); they already include the adapter.",
        )
    if model.lora_rank is None:
        raise ModelError(
            f"--lora: {model.registered_name} version {model.version} has no adapter in "
            f"{ADAPTER_SUBDIR}/",
            fix="Drop --lora, or register a model exported with its adapter.",
        )
    args = ["--enable-lora", "--lora-modules", f"{served_name}-lora={MOUNT}/{ADAPTER_SUBDIR}"]
    if model.lora_rank > 16:
        args.append(f"--max-lora-rank={_max_lora_rank(model.lora_rank)}")
    return args


def render_inferenceservice(model: ServedModel, options: KServeOptions) -> dict[str, Any]:
    """The InferenceService serving ``model`` with KServe's Hugging Face runtime.

    Raises:
        ConfigError: A name is not a DNS-1123 label, or LoRA is asked of a non-Llama model.
        ModelError: LoRA is asked of a version without an adapter.
    """
    name = _dns_label(
        options.name or default_name(model.registered_name, model.alias), "--isvc-name"
    )
    metadata: dict[str, Any] = {
        "name": name,
        "labels": {"app.kubernetes.io/managed-by": "fedtune", "app.kubernetes.io/name": name},
        # Annotations, not labels: registry names may hold characters labels forbid.
        "annotations": {
            "fedtune.io/registered-model": model.registered_name,
            "fedtune.io/model-version": str(model.version),
            "fedtune.io/alias": model.alias,
        },
    }
    if options.namespace:
        metadata["namespace"] = _dns_label(options.namespace, "--namespace")
    if model.audit is not None:
        metadata["annotations"]["fedtune.io/audit-memorization"] = f"{model.audit:.6g}"
    args = [f"--model_name={name}"]
    if options.lora:
        args += _lora_args(model, name)
    resources = {k: dict(v) for k, v in _DEFAULT_RESOURCES.items()}
    if options.gpus:
        resources["requests"]["nvidia.com/gpu"] = str(options.gpus)
        resources["limits"]["nvidia.com/gpu"] = str(options.gpus)
    predictor_model: dict[str, Any] = {"modelFormat": {"name": "huggingface"}}
    if options.runtime:
        predictor_model["runtime"] = options.runtime
    predictor_model.update(
        {
            "storageUri": model.storage_uri,
            "args": args,
            "resources": resources,
            # Writable root: vLLM and the Hugging Face server write caches under $HOME.
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": options.run_as_user,
                "allowPrivilegeEscalation": False,
                "privileged": False,
                "readOnlyRootFilesystem": False,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            },
        }
    )
    predictor: dict[str, Any] = {}
    if options.service_account:
        predictor["serviceAccountName"] = options.service_account
    predictor["securityContext"] = {
        "runAsNonRoot": True,
        "runAsUser": options.run_as_user,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    predictor["model"] = predictor_model
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": metadata,
        "spec": {"predictor": predictor},
    }


def to_yaml(doc: dict[str, Any]) -> str:
    """The manifest as YAML, keys in the order they were built."""
    return str(yaml.safe_dump(doc, sort_keys=False))
