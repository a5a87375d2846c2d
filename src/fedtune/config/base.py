"""Shared pydantic base and field types for every config section."""

from __future__ import annotations

import re
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    ModelWrapValidatorHandler,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

# Kubernetes DNS-1123 label: tenant names double as namespace names, pod-name parts and
# store prefixes, so the strictest common rule applies to all of them.
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class StrictModel(BaseModel):
    """Frozen, unknown keys rejected, validated on assignment: every config section uses it."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False
    )

    @model_validator(mode="wrap")
    @classmethod
    def _strict_scalars(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        """No booleans as numbers, no quoted integers, nothing but true/false as a boolean.

        (Floats may be strings: YAML reads ``1e-3`` as one.) A wrap validator, so a refused
        scalar is reported together with every other problem of the section (unknown keys,
        wrong types elsewhere) instead of hiding them.
        """
        if not isinstance(data, dict):
            return handler(data)
        refused = {}
        for name, field in cls.model_fields.items():
            key = field.alias or name
            if key in data and (problem := scalar_problem(field.annotation, data[key])):
                refused[key] = problem
        if not refused:
            return handler(data)
        errors = [
            InitErrorDetails(type=_custom("strict_scalar", problem), loc=(key,), input=data[key])
            for key, problem in refused.items()
        ]
        try:
            handler(data)
        except ValidationError as exc:
            errors += [
                InitErrorDetails(type=_custom(e["type"], e["msg"]), loc=e["loc"], input=e["input"])
                for e in exc.errors(include_url=False)
                if not (e["loc"] and e["loc"][0] in refused)
            ]
        raise ValidationError.from_exception_data(cls.__name__, errors)


def _custom(kind: str, message: str) -> PydanticCustomError:
    """An error of type ``kind`` with ``message`` as is (braces in it are not a template)."""
    return PydanticCustomError(kind, "{message}", {"message": message})


def check_dns1123_label(value: str) -> str:
    """Reject anything Kubernetes would not accept as a namespace / object name."""
    if len(value) > 63 or not _DNS1123_LABEL.match(value):
        raise ValueError(
            f"{value!r} is not a DNS-1123 label; use at most 63 lowercase letters, digits "
            "and '-', starting and ending with a letter or digit (e.g. 'tenant-a')"
        )
    return value


Dns1123Label = Annotated[str, AfterValidator(check_dns1123_label)]

_URI_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
STORE_SCHEMES = ("file", "s3")  # what fedtune.storage.open_store opens


def check_store_uri(value: str) -> str:
    """Refuse a URI whose scheme no store opens (it would fail only when the run reads it)."""
    match = _URI_SCHEME.match(value)
    if match and match.group(1).lower() not in STORE_SCHEMES:
        raise ValueError(
            f"unsupported URI scheme {match.group(1) + '://'!r}; use a local path, file:// "
            "or s3://bucket/prefix"
        )
    return value


StoreUri = Annotated[str, AfterValidator(check_store_uri)]


def scalar_kinds(annotation: Any) -> set[str]:
    """The scalar types a field accepts: subsets of int, float, bool, str, none, other."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return set().union(*(scalar_kinds(a) for a in get_args(annotation)))
    if origin is Literal:
        return {"str" if isinstance(v, str) else "other" for v in get_args(annotation)}
    if origin is Annotated:
        return scalar_kinds(get_args(annotation)[0])
    names = {int: "int", float: "float", bool: "bool", str: "str", type(None): "none"}
    return {names.get(annotation, "other")}


def scalar_problem(annotation: Any, value: Any) -> str | None:
    """Why ``value`` is refused for a field of ``annotation`` under the strict rules, if it is."""
    kinds = scalar_kinds(annotation)
    if not kinds or "other" in kinds:
        return None
    if isinstance(value, bool) and "bool" not in kinds and kinds & {"int", "float"}:
        return f"expected a number, got the boolean {str(value).lower()}; write a number"
    if "bool" in kinds and not kinds - {"bool", "none"} and not isinstance(value, bool | None):
        return f"expected true or false, got {value!r}; write true or false"
    if isinstance(value, str) and "int" in kinds and not kinds & {"float", "str"}:
        return f"expected an integer, got the string {value!r}; write it without quotes"
    if isinstance(value, float) and "int" in kinds and "float" not in kinds:
        return f"expected an integer, got {value!r}; write a whole number without a point"
    return None
