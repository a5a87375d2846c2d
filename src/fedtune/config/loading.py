"""Read a job file, resolve its relative paths, validate it and report every problem at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from fedtune.config.job import JobConfig
from fedtune.core.errors import ConfigError

# Fields that hold a local path or URI; relative paths in them are resolved against the
# directory of the job file, so a job runs the same from any working directory.
_PATH_FIELDS: tuple[tuple[str, ...], ...] = (
    ("workdir",),
    ("exchange_uri",),
    ("provider_store_uri",),
    ("public_data_uri",),
    ("tokenizer",),
    ("model", "uri"),
    ("model", "tenant_uri"),
)
_TENANT_PATH_FIELDS = ("data_uri", "store_uri", "tokenizer")  # + model.uri (fedmkt)

# A fix for each pydantic error type that has no message of our own.
_FIXES = {
    "extra_forbidden": "remove this key or correct its spelling",
    "missing": "add this required field",
    "union_tag_invalid": "use one of the names listed",
    "union_tag_not_found": "add the discriminating field (e.g. `name:` or `source:`)",
    "literal_error": "use one of the allowed values",
    "string_pattern_mismatch": "match the pattern shown",
}


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that repeats a key (YAML keeps the last one)."""


def _construct_unique_mapping(
    loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False
) -> Any:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
        line = key_node.start_mark.line + 1
        if isinstance(key, str | int | float | bool) and key in seen:
            raise ConfigError(
                f"duplicate key {key!r} at line {line} (first at line {seen[key]}); YAML would "
                "silently keep only the last value",
                fix="Keep one of the two entries and delete the other.",
            )
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping
)


def _resolve(value: Any, base_dir: Path) -> Any:
    if not isinstance(value, str) or "://" in value or value in ("builtin", "auto"):
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (base_dir / path).resolve())


def _resolve_paths(raw: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    out = dict(raw)
    for field_path in _PATH_FIELDS:
        parent: Any = out
        for part in field_path[:-1]:
            child = parent.get(part) if isinstance(parent, dict) else None
            if not isinstance(child, dict):
                parent = None
                break
            parent[part] = child = dict(child)
            parent = child
        if isinstance(parent, dict) and field_path[-1] in parent:
            parent[field_path[-1]] = _resolve(parent[field_path[-1]], base_dir)
    if isinstance(out.get("tenants"), list):
        tenants = []
        for tenant in out["tenants"]:
            if isinstance(tenant, dict):
                tenant = dict(tenant)
                for key in _TENANT_PATH_FIELDS:
                    if key in tenant:
                        tenant[key] = _resolve(tenant[key], base_dir)
                if isinstance(tenant.get("model"), dict) and "uri" in tenant["model"]:
                    tenant["model"] = {**tenant["model"], "uri": _resolve(tenant["model"]["uri"], base_dir)}
            tenants.append(tenant)
        out["tenants"] = tenants
    return out


def format_validation_errors(error: ValidationError) -> list[str]:
    """One line per problem: ``field.path: message (got VALUE) -- fix``."""
    lines = []
    for item in error.errors(include_url=False):
        loc = ".".join(str(p) for p in item["loc"]) or "<job>"
        if item["type"] == "union_tag_invalid" and item["loc"] == ("algorithm",):
            ctx = item.get("ctx") or {}
            lines.append(
                f"algorithm.name: unknown algorithm {ctx.get('tag')!r}; the installed algorithms "
                f"are {ctx.get('expected_tags')} -- use one of them (each is a package under "
                "fedtune/algorithms/)"
            )
            continue
        msg = item["msg"].removeprefix("Value error, ")
        fix = _FIXES.get(item["type"])
        got = item.get("input")
        shown = "" if isinstance(got, dict | list) or item["type"] == "missing" else f" (got {got!r})"
        lines.append(f"{loc}: {msg}{shown}" + (f" -- {fix}" if fix else ""))
    return lines


def parse_job(raw: Any, *, base_dir: Path | None = None, source: str = "<job>") -> JobConfig:
    """Validate an already-parsed YAML document into a :class:`JobConfig`."""
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{source}: the job file must be a YAML mapping at the top level, got {type(raw).__name__}",
            fix="Start the file with `name: my-job` and the other sections (see examples/).",
        )
    if base_dir is not None:
        raw = _resolve_paths(raw, base_dir)
    try:
        job = JobConfig.model_validate(raw)
    except ValidationError as exc:
        lines = format_validation_errors(exc)
        raise ConfigError(
            f"{source}: {len(lines)} problem(s) in the job config:\n  " + "\n  ".join(lines),
            fix="Correct each field listed above, then run `fedtune validate` again.",
        ) from None
    if base_dir is not None:
        job._source_dir = str(base_dir.absolute())  # what the stored fingerprint counts from
    return job


def load_job(path: str | Path) -> JobConfig:
    """Read and validate a job file; relative paths inside resolve against its directory."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"job file {str(path)!r} does not exist", fix="Pass the path of a job YAML file."
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read job file {str(path)!r}: {exc}") from None
    return parse_job_text(text, base_dir=path.resolve().parent, source=str(path))


def parse_job_text(text: str, *, base_dir: Path | None = None, source: str = "<job>") -> JobConfig:
    """Validate a job given as YAML (or JSON) text, e.g. a job file read from a bucket."""
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}", fix=exc.fix) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(
            f"{source}: malformed YAML{where}: {problem}",
            fix="Fix the YAML syntax there (indentation, a missing ':' or an unclosed quote).",
        ) from None
    return parse_job(raw, base_dir=base_dir, source=source)
