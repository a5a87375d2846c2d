"""The job fingerprint a stored run is pinned to, and what changed when a resume is refused.

A resumed run must be the same training: the fingerprint hashes the job minus the fields a
resumption may change. It does not depend on where the project lies: local paths inside
the job file's folder (else the workdir's parent) count relative to it, so a project folder
copied or moved elsewhere resumes. The run record keeps the fingerprinted job itself, so a
refusal names each changed field with its stored and its new value.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from fedtune.config.job import JobConfig, LimitsConfig
from fedtune.core.errors import ConfigError

#: Fields that may change between a run and its resumption (they do not alter results).
RESUMABLE_CHANGES = ("rounds", "engine", "tracking", "audit", "provider", "storage", "export")
#: Limits that bound waits only: a resumed run may wait longer or shorter.
_WAIT_LIMITS = (
    "store_connect_timeout_s",
    "store_read_timeout_s",
    "store_max_attempts",
    "tracking_timeout_s",
    "tracking_max_retries",
)
#: Limits added after the first fingerprints were stored (dropped from the legacy form).
_LATER_LIMITS = (*_WAIT_LIMITS, "max_record_bytes")
_PROJECT = "<project>"
#: Training fields added after the first fingerprints were stored, with their defaults.
_LATER_TRAINING = {"device": "auto", "precision": "fp32", "gradient_checkpointing": False,
                   "compile": False, "kernels": "none"}


def _base_dump(job: JobConfig) -> dict[str, Any]:
    dump = job.model_dump(mode="json", exclude=set(RESUMABLE_CHANGES))
    if not job.secure_aggregation.enabled:  # off: the fingerprints of earlier runs hold
        dump.pop("secure_aggregation")
    if job.differential_privacy is None:  # absent: as before the field existed
        dump.pop("differential_privacy")
    else:  # the budget decides where a run stops, not what a round computes
        dump["differential_privacy"].pop("target_epsilon")
    for tenant in dump["tenants"]:
        if tenant.get("identity_key") is None:  # unset: as before the field existed
            tenant.pop("identity_key", None)
        if tenant.get("dp_sgd") is None:  # unset: as before the field existed
            tenant.pop("dp_sgd", None)
        else:  # the tenant's budget decides whether it trains, not what a step computes
            tenant["dp_sgd"].pop("target_epsilon")
    if dump["limits"].get("max_update_norm") is None:  # unset: as before the field existed
        dump["limits"].pop("max_update_norm", None)
    if dump["limits"].get("max_update_norm_ratio") == LimitsConfig().max_update_norm_ratio:  # default: as before
        dump["limits"].pop("max_update_norm_ratio", None)
    for name, default in _LATER_TRAINING.items():  # at their defaults: as before they existed
        if dump["training"].get(name) == default:
            dump["training"].pop(name)
    return dump


def project_dir(job: JobConfig) -> Path:
    """The folder local paths of the fingerprint count from: the job file's, else the
    workdir's parent."""
    return Path(job.source_dir or Path(job.workdir).absolute().parent)


def _relative(value: Any, project: Path) -> Any:
    """``value`` with every local path inside ``project`` written relative to it."""
    if isinstance(value, dict):
        return {k: _relative(v, project) for k, v in value.items()}
    if isinstance(value, list):
        return [_relative(v, project) for v in value]
    if isinstance(value, str) and (value.startswith("/") or value.startswith("file:///")):
        path = Path(value.removeprefix("file://"))
        if path.is_relative_to(project):
            return f"{_PROJECT}/{path.relative_to(project).as_posix()}"
    return value


def fingerprinted(job: JobConfig) -> dict[str, Any]:
    """The job as the fingerprint sees it: minus fields a resumed run may change, its local
    paths relative to the project folder."""
    dump = _base_dump(job)
    for name in _WAIT_LIMITS:
        dump["limits"].pop(name)
    if job.limits.max_record_bytes == LimitsConfig().max_record_bytes:
        dump["limits"].pop("max_record_bytes")  # the default: fingerprints from before it hold
    return dict(_relative(dump, project_dir(job).absolute()))


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def config_fingerprint(job: JobConfig) -> str:
    """sha256 of :func:`fingerprinted`."""
    return _digest(fingerprinted(job))


def legacy_fingerprint(job: JobConfig) -> str:
    """The fingerprint fedtune stored before it was location-independent (absolute paths)."""
    dump = _base_dump(job)
    for name in _LATER_LIMITS:
        dump["limits"].pop(name)
    return _digest(dump)


def config_sections(job: JobConfig) -> dict[str, str]:
    """sha256 of each top-level field of the fingerprint, to name what changed."""
    return {key: _digest(value)[:16] for key, value in fingerprinted(job).items()}


def run_record(job: JobConfig) -> dict[str, Any]:
    """What a new run stores about its job (``run.json``, without its tracker run id)."""
    return {
        "fingerprint": config_fingerprint(job),
        "sections": config_sections(job),
        "config": fingerprinted(job),
        "job": job.name,
    }


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"training.lr": 0.01, "tenants.0.name": "a", ...}``."""
    items: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list):
        items = [(str(i), v) for i, v in enumerate(value)]
    else:
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, item in items:
        out.update(_leaves(item, f"{prefix}.{key}" if prefix else key))
    if not items:
        out[prefix] = value
    return out


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def changed_fields(stored: dict[str, Any], job: JobConfig) -> list[str]:
    """``field: old -> new`` for every field of ``job`` that differs from a stored record."""
    before = _leaves(stored.get("config") or {})
    now = _leaves(fingerprinted(job))
    missing = "(not set)"
    return [
        f"{key}: {_shown(before.get(key, missing))} -> {_shown(now.get(key, missing))}"
        for key in sorted(set(before) | set(now))
        if before.get(key, missing) != now.get(key, missing)
    ]


def check_resumable(stored: dict[str, Any], job: JobConfig, where: str) -> dict[str, Any]:
    """The stored run record, brought up to date, if ``job`` is the training it pinned.

    Raises:
        ConfigError: ``job`` changed in a field a resumed run may not change; the message
            names each such field with its stored and its new value.
    """
    if stored.get("fingerprint") in (config_fingerprint(job), legacy_fingerprint(job)):
        return {**stored, **run_record(job)}  # a record from before: now location-independent
    if stored.get("config") is not None:
        lines = changed_fields(stored, job)
    else:
        before, now = stored.get("sections") or {}, config_sections(job)
        lines = [f"{k} (values not recorded)" for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k)]
    listed = "".join(f"\n  {line}" for line in lines) if lines else ""
    raise ConfigError(
        f"job {job.name!r} changed since its stored run at {where} (only "
        f"{', '.join(RESUMABLE_CHANGES)} and the wait limits may change when resuming)"
        + (f"; changed:{listed}" if listed else ""),
        fix="Restore the original values shown above, or pass --fresh to start over.",
    )
