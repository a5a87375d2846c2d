"""References to registered model versions and the rules an alias must follow."""

from __future__ import annotations

import re
from dataclasses import dataclass

from fedtune.core.errors import ConfigError

# Lowercase like the job config's `tracking.alias`, so an alias can double as part of a
# Kubernetes name; MLflow itself reserves "latest" and the version-like "v<number>".
_ALIAS = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_RESERVED = re.compile(r"^(latest|v\d+)$")
_ALIAS_FIX = (
    "Use 1-63 lowercase letters, digits, '_' or '-', starting with a letter and not 'latest' "
    "or v<number>, e.g. champion."
)


def check_alias(alias: str) -> str:
    """Return ``alias`` if MLflow and fedtune accept it.

    Raises:
        ConfigError: It has characters outside ``[a-z0-9_-]``, is too long, or is reserved.
    """
    if not _ALIAS.match(alias) or _RESERVED.match(alias):
        raise ConfigError(f"invalid model alias {alias!r}", fix=_ALIAS_FIX)
    return alias


def check_version(version: str | int) -> int:
    """Return a registered model version as an int (versions count from 1).

    Raises:
        ConfigError: It is not a positive whole number.
    """
    text = str(version).strip()
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(
            f"invalid model version {version!r}",
            fix="Pass the version number the registry shows, e.g. --version 3.",
        )
    return int(text)


@dataclass(frozen=True)
class ModelSpec:
    """A registered model version, named by alias or by number (exactly one is set)."""

    name: str
    alias: str | None = None
    version: int | None = None

    def __str__(self) -> str:
        return f"{self.name}@{self.alias}" if self.alias else f"{self.name}/{self.version}"


def parse_model_spec(text: str) -> ModelSpec:
    """Parse ``NAME@ALIAS`` or ``NAME/VERSION`` (an optional ``models:/`` prefix is allowed).

    Raises:
        ConfigError: The text names no alias or version, or either part is invalid.
    """
    ref = text.strip().removeprefix("models:/")
    fix = "Name a model as NAME@ALIAS (e.g. quickstart@champion) or NAME/VERSION (quickstart/2)."
    if "@" in ref:
        name, alias = ref.split("@", 1)
        if not name:
            raise ConfigError(f"model reference {text!r} has no model name", fix=fix)
        return ModelSpec(name=name, alias=check_alias(alias))
    if "/" in ref:
        name, version = ref.rsplit("/", 1)
        if not name:
            raise ConfigError(f"model reference {text!r} has no model name", fix=fix)
        return ModelSpec(name=name, version=check_version(version))
    raise ConfigError(f"model reference {text!r} names no alias or version", fix=fix)
