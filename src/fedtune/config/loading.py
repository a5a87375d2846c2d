"""Read a job file, resolve its relative paths, validate it and report every problem at once."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from fedtune.config.job import JobConfig
from fedtune.config.overrides import Override, parse_overrides
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
# Fields that name a model or tokenizer: there a bare ``org/name`` that is no folder beside the
# job file is a Hugging Face hub id (fedtune.models.hub). FedPT's large model is read by the
# provider from where it runs, so only its hub ids are rewritten, not its relative paths.
_MODEL_FIELDS = {("tokenizer",), ("model", "uri"), ("model", "tenant_uri")}
_HUB_ONLY_FIELDS = (("algorithm", "large_model", "uri"), ("algorithm", "large_model", "tokenizer"))

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


def _resolve(value: Any, base_dir: Path, *, model: bool = False, paths: bool = True) -> Any:
    if not isinstance(value, str) or "://" in value or value in ("builtin", "auto"):
        return value
    if model:
        from fedtune.models.hub import bare_hub_uri

        if (hub := bare_hub_uri(value, base_dir)) is not None:
            return hub
    if not paths:
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (base_dir / path).resolve())


def _resolve_paths(raw: dict[str, Any], base_dir: Path, *, paths: bool = True) -> dict[str, Any]:
    """``raw`` with relative paths made absolute (unless not ``paths``) and bare hub ids in
    model and tokenizer fields written as ``hf://`` ids."""
    out = dict(raw)
    for field_path in (*_PATH_FIELDS, *_HUB_ONLY_FIELDS):
        parent: Any = out
        for part in field_path[:-1]:
            child = parent.get(part) if isinstance(parent, dict) else None
            if not isinstance(child, dict):
                parent = None
                break
            parent[part] = child = dict(child)
            parent = child
        if isinstance(parent, dict) and field_path[-1] in parent:
            parent[field_path[-1]] = _resolve(
                parent[field_path[-1]],
                base_dir,
                model=field_path in _MODEL_FIELDS or field_path in _HUB_ONLY_FIELDS,
                paths=paths and field_path not in _HUB_ONLY_FIELDS,
            )
    if isinstance(out.get("tenants"), list):
        tenants = []
        for tenant in out["tenants"]:
            if isinstance(tenant, dict):
                tenant = dict(tenant)
                for key in _TENANT_PATH_FIELDS:
                    if key in tenant:
                        tenant[key] = _resolve(
                            tenant[key], base_dir, model=key == "tokenizer", paths=paths
                        )
                if isinstance(tenant.get("model"), dict) and "uri" in tenant["model"]:
                    uri = _resolve(tenant["model"]["uri"], base_dir, model=True, paths=paths)
                    tenant["model"] = {**tenant["model"], "uri": uri}
            tenants.append(tenant)
        out["tenants"] = tenants
    return out


def format_validation_errors(error: ValidationError | list[Any]) -> list[str]:
    """One line per problem: ``field.path: message (got VALUE) -- fix``."""
    lines = []
    items = error.errors(include_url=False) if isinstance(error, ValidationError) else error
    for item in items:
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
        quiet = isinstance(got, dict | list) or item["type"] in ("missing", "strict_scalar")
        shown = "" if quiet else f" (got {got!r})"
        lines.append(f"{loc}: {msg}{shown}" + (f" -- {fix}" if fix else ""))
    return lines


#: Validation passes at most: types and unknown keys first, then the cross-field checks that
#: pydantic runs only on a section whose fields all passed.
_MAX_STAGES = 4


def _validate_in_stages(raw: dict[str, Any]) -> tuple[JobConfig | None, list[str]]:
    """Validate ``raw``; on failure collect the problems of every stage, not only the first.

    Pydantic skips a section's cross-field checks while any of its fields is invalid, so a
    wrong type would hide a missing ``model.tenant_uri``. Each further pass drops the fields
    already reported (their defaults apply) and keeps the problems that are new; a check on
    a section one of whose own fields was dropped is left out, since it judged a default
    the user never wrote (the job-level checks always count).
    """
    problems: list[str] = []
    reported: set[tuple[Any, ...]] = set()
    dropped: set[tuple[Any, ...]] = set()
    current = copy.deepcopy(raw)
    for _ in range(_MAX_STAGES):
        try:
            job = JobConfig.model_validate(current)
        except ValidationError as exc:
            fresh = [
                e for e in exc.errors(include_url=False)
                if tuple(e["loc"]) not in reported
                and not (e["type"] == "missing" and tuple(e["loc"]) in dropped)
                and not any(d[:-1] == tuple(e["loc"]) for d in dropped if len(d) > 1)
            ]
            if not fresh:
                return None, problems
            problems += format_validation_errors(fresh)
            reported.update(tuple(e["loc"]) for e in fresh)
            removable = [tuple(e["loc"]) for e in fresh if e["loc"]]
            if not removable or not all(_drop(current, loc) for loc in removable):
                return None, problems  # a problem without a field to drop: stop here
            dropped.update(removable)
        else:
            return (job, []) if not problems else (None, problems)
    return None, problems


def _drop(raw: Any, loc: tuple[Any, ...]) -> bool:
    """Delete the field at pydantic error location ``loc`` in ``raw``; False if not found.

    A discriminated union adds its tag to the location (``algorithm.fedpt.alpha``): a part
    naming the section's ``name``/``source`` value is skipped.
    """
    node = raw
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            if not parts:
                return False  # a list item itself: nothing sensible to drop
            node = node[part]
        elif isinstance(node, dict) and part in node:
            if not parts:
                del node[part]
                return True
            node = node[part]
        elif isinstance(node, dict) and part in (node.get("name"), node.get("source")):
            continue
        else:
            return False
    return False


def _is_path_field(where: tuple[str | int, ...]) -> bool:
    if where in _PATH_FIELDS:
        return True
    if len(where) >= 3 and where[0] == "tenants" and isinstance(where[1], int):
        return where[2:] in [(key,) for key in _TENANT_PATH_FIELDS] or where[2:] == ("model", "uri")
    return False


def _apply_overrides(raw: dict[str, Any], overrides: Sequence[Override]) -> dict[str, Any]:
    """``raw`` with every ``--set`` applied; a path typed on the command line is relative to
    the working directory (the shell's), not to the job file."""
    out = copy.deepcopy(raw)
    for override in overrides:
        where = override.apply(out)
        if _is_path_field(where) and isinstance(override.value, str):
            named = where in _MODEL_FIELDS or where[-1] == "tokenizer" or where[-2:] == ("model", "uri")
            _set(out, where, _resolve(override.value, Path.cwd(), model=named))
    return out


def _set(raw: Any, where: tuple[str | int, ...], value: Any) -> None:
    for part in where[:-1]:
        raw = raw[part]
    raw[where[-1]] = value


def parse_job(
    raw: Any,
    *,
    base_dir: Path | None = None,
    source: str = "<job>",
    overrides: Sequence[Override] = (),
) -> JobConfig:
    """Validate an already-parsed YAML document (with ``--set`` overrides) into a job."""
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{source}: the job file must be a YAML mapping at the top level, got {type(raw).__name__}",
            fix="Start the file with `name: my-job` and the other sections (see examples/).",
        )
    if overrides:
        raw = _apply_overrides(raw, overrides)
    # Without a job file (a run form, a pod's JSON) paths stay as given; a bare hub id still
    # reads as one unless such a folder exists here.
    raw = _resolve_paths(raw, base_dir or Path.cwd(), paths=base_dir is not None)
    job, problems = _validate_in_stages(raw)
    if job is None:
        raise ConfigError(
            f"{source}: {len(problems)} problem(s) in the job config:\n  " + "\n  ".join(problems),
            fix="Correct each field listed above, then run `fedtune validate` again.",
        )
    if base_dir is not None:
        job._source_dir = str(base_dir.absolute())  # what the stored fingerprint counts from
    return job


def load_job(path: str | Path, overrides: Sequence[str] = ()) -> JobConfig:
    """Read and validate a job file; relative paths inside resolve against its directory.

    ``overrides`` are ``--set FIELD.PATH=VALUE`` texts (:mod:`fedtune.config.overrides`),
    applied before validation.
    """
    parsed = parse_overrides(overrides)
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"job file {str(path)!r} does not exist", fix="Pass the path of a job YAML file."
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read job file {str(path)!r}: {exc}") from None
    return parse_job_text(
        text, base_dir=path.resolve().parent, source=str(path), overrides=parsed
    )


def parse_job_text(
    text: str,
    *,
    base_dir: Path | None = None,
    source: str = "<job>",
    overrides: Sequence[Override] = (),
) -> JobConfig:
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
    return parse_job(raw, base_dir=base_dir, source=source, overrides=overrides)
