"""``--set path=value``: change one field of a job file from the command line.

Like Flower's ``flwr run --run-config k=v``: the path is the field's dotted name
(``training.lr``, ``algorithm.alpha``); a tenant is picked by position or by name
(``tenants.0.data_uri``, ``tenants.tenant-a.data_uri``). The value is read as YAML, so
``0.01`` is a number, ``true`` a boolean, ``[q_proj, v_proj]`` a list and ``null`` clears a
field; quote a string that would read as something else (``name='"007"'``). The job is
validated after every override is applied, so a misspelt path is reported like an unknown
key in the file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from fedtune.core.errors import ConfigError

_FIX = (
    "Write --set FIELD.PATH=VALUE, e.g. --set training.lr=0.01 or "
    "--set tenants.tenant-a.data_uri=data/a.jsonl (see `fedtune validate --help`)."
)


@dataclass(frozen=True)
class Override:
    """One ``--set`` assignment: where in the job document, and the value as YAML read it."""

    text: str
    path: tuple[str, ...]
    value: Any

    @classmethod
    def parse(cls, text: str) -> Override:
        key, sep, value_text = text.partition("=")
        parts = tuple(key.strip().split("."))
        if not sep or not key.strip() or any(not p for p in parts):
            raise ConfigError(f"--set {text!r} is not of the form FIELD.PATH=VALUE", fix=_FIX)
        try:
            value = yaml.safe_load(value_text) if value_text.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(
                f"--set {text!r}: the value {value_text!r} is not valid YAML ({exc})",
                fix="Quote the value, e.g. --set name='\"my: job\"'.",
            ) from None
        return cls(text=text, path=parts, value=value)

    def apply(self, raw: dict[str, Any]) -> tuple[str | int, ...]:
        """Set the value in ``raw`` (in place); return the path with list items as indices."""
        node: Any = raw
        where: list[str | int] = []
        for i, part in enumerate(self.path):
            last = i == len(self.path) - 1
            if isinstance(node, list):
                index = _list_index(node, part, self.text, ".".join(map(str, where)))
                where.append(index)
                if last:
                    node[index] = self.value
                else:
                    node = node[index]
                continue
            if not isinstance(node, dict):
                raise ConfigError(
                    f"--set {self.text!r}: {'.'.join(map(str, where))} is "
                    f"{type(node).__name__} {node!r}, which has no field {part!r}",
                    fix=_FIX,
                )
            where.append(part)
            if last:
                node[part] = self.value
            else:
                node = node.setdefault(part, {})
        return tuple(where)


def _list_index(items: list[Any], part: str, text: str, where: str) -> int:
    """A list item by position (``0``) or, for a list of named entries, by its ``name``."""
    if part.isdigit():
        if int(part) < len(items):
            return int(part)
        raise ConfigError(
            f"--set {text!r}: {where} has {len(items)} entries, so there is no entry {part}",
            fix=f"Use a position from 0 to {len(items) - 1}, or the entry's name.",
        )
    names = [item.get("name") for item in items if isinstance(item, dict)]
    if part in names:
        return names.index(part)
    raise ConfigError(
        f"--set {text!r}: {where} has no entry named {part!r} (it has "
        f"{', '.join(repr(n) for n in names) or 'no named entries'})",
        fix="Use one of the names listed, or the entry's position (0 for the first).",
    )


def parse_overrides(texts: Sequence[str]) -> list[Override]:
    """Parse every ``--set``; a malformed one is refused before the job file is read."""
    return [Override.parse(text) for text in texts]
