"""``fedtune promote`` as a function: gate, render, then move the alias.

Everything that can fail is checked before the registry changes: the version exists, it
passes the leakage gate (:mod:`fedtune.serving.gate`), and, when a manifest is asked for, its
files are at a physical location KServe can fetch and the InferenceService validates
(:mod:`fedtune.serving.kserve`, :mod:`fedtune.serving.schema`). Only then is the alias moved
and the manifest file put in place.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedtune.core.errors import ConfigError, StoreError
from fedtune.serving.gate import GateResult, LeakageGate
from fedtune.serving.kserve import (
    ADAPTER_SUBDIR,
    KServeOptions,
    ServedModel,
    physical_storage_uri,
    render_inferenceservice,
    to_yaml,
)
from fedtune.serving.mlflow_registry import ModelRegistry, VersionRecord
from fedtune.serving.refs import ModelSpec, check_alias, check_version
from fedtune.serving.schema import validate_inferenceservice

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromotionRequest:
    """What to promote and what to write.

    Attributes:
        name: Registered model name.
        version: Version to promote.
        alias: Alias to point at it (e.g. ``champion``).
        gate: Leakage gate settings.
        kserve_out: Where to write the InferenceService YAML; None writes none.
        kserve: Deployment choices of the manifest.
        artifacts_destination: The tracking server's ``--artifacts-destination`` (proxied
            artifacts only).
    """

    name: str
    version: int | str
    alias: str
    gate: LeakageGate = field(default_factory=LeakageGate)
    kserve_out: Path | None = None
    kserve: KServeOptions = field(default_factory=KServeOptions)
    artifacts_destination: str | None = None


MERGED_SUBDIR = "merged"  # the exported copy with the adapter merged in


@dataclass(frozen=True)
class PromotionResult:
    """What happened: the alias move, the gate's verdict, the manifest written."""

    name: str
    version: int
    alias: str
    previous_version: int | None
    gate: GateResult
    inferenceservice: dict[str, Any] | None
    kserve_out: Path | None


def served_model(
    registry: ModelRegistry,
    record: VersionRecord,
    alias: str,
    audit: float | None,
    artifacts_destination: str | None,
    lora: bool = False,
) -> ServedModel:
    """Gather what the manifest needs from the version's files (a few small reads).

    Exports keep un-merged base weights at the top level with the adapter in ``adapter/``
    (so the adapter is applied exactly once), plus a ``merged/`` copy when the job set
    ``export.merged``. Without ``lora`` the manifest serves ``merged/`` (an export without
    one is refused with a fix); with it, the base plus vLLM's LoRA on ``adapter/``.
    """
    storage_root = physical_storage_uri(record.location, artifacts_destination)
    subpath = registry.hf_subpath(record)
    config_text = registry.read_text(record.location, f"{subpath}/config.json")
    model_type = json.loads(config_text).get("model_type") if config_text else None
    adapter_text = registry.read_text(
        record.location, f"{subpath}/{ADAPTER_SUBDIR}/adapter_config.json"
    )
    lora_rank = int(json.loads(adapter_text).get("r", 0)) if adapter_text else None
    if adapter_text and not lora:
        if not registry.read_text(record.location, f"{subpath}/{MERGED_SUBDIR}/config.json"):
            raise ConfigError(
                f"{record.name} version {record.version} holds base weights plus an adapter but "
                f"no {MERGED_SUBDIR}/ copy; serving its top level alone would drop the adapter",
                fix="Pass --lora (Llama-shaped models), or export with `export: {merged: true}` "
                "in the job (the export then adds the merged copy) and register that version.",
            )
        subpath = f"{subpath}/{MERGED_SUBDIR}"
        lora_rank = None
    return ServedModel(
        registered_name=record.name,
        version=record.version,
        alias=alias,
        storage_uri=f"{storage_root}/{subpath}",
        model_type=model_type,
        lora_rank=lora_rank,
        audit=audit,
    )


def _stage(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise StoreError(
            f"cannot write the InferenceService to {str(path)!r}: {exc.strerror}",
            fix="Pass a --kserve-out path in a writable folder.",
        ) from None
    return tmp


def promote(registry: ModelRegistry, request: PromotionRequest) -> PromotionResult:
    """Check, render and promote one version; the registry changes only if all checks pass.

    Raises:
        ConfigError: Invalid alias, version or options; artifacts KServe cannot fetch.
        StoreError: Unknown model or version; MLflow or the manifest file fails.
        ModelError: The leakage gate refuses the version.
    """
    alias = check_alias(request.alias)
    version = check_version(request.version)
    record = registry.version(ModelSpec(name=request.name, version=version))
    verdict = request.gate.check(record.name, version, record.tags, record.model_tags)
    isvc = None
    staged = None
    if request.kserve_out is not None:
        model = served_model(
            registry, record, alias, verdict.audit, request.artifacts_destination,
            lora=request.kserve.lora,
        )
        isvc = render_inferenceservice(model, request.kserve)
        validate_inferenceservice(isvc)
        staged = _stage(request.kserve_out, to_yaml(isvc))
    try:
        registry.set_alias(record.name, alias, version)
    except BaseException:
        if staged is not None:
            staged.unlink(missing_ok=True)
        raise
    if staged is not None and request.kserve_out is not None:
        staged.replace(request.kserve_out)
    previous = record.aliases.get(alias)
    log.info("%s@%s -> version %d (was %s)", record.name, alias, version, previous)
    return PromotionResult(
        name=record.name,
        version=version,
        alias=alias,
        previous_version=previous,
        gate=verdict,
        inferenceservice=isvc,
        kserve_out=request.kserve_out,
    )
