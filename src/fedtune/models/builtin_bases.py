"""Base models that ship inside the package: ``model.uri: builtin://NAME``.

A few-MB pretrained base lives in ``fedtune/assets/bases/NAME/`` (a Hugging Face directory
with its tokenizer, and ``fedtune_pretrain.json`` saying how it was made: its spec hash, the
corpus sha256, the loss curve and the machine). Every install and every image has it, so
provider and tenants read the same weights without a download or a bucket: the quickstart
starts from one. :func:`fedtune.models.hub.local_model_path` resolves these URIs with hub ids.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Final

from fedtune.core.errors import ModelError

__all__ = ["SCHEME", "available", "base_dir", "is_builtin"]

SCHEME: Final = "builtin://"


def is_builtin(uri: str) -> bool:
    return uri.startswith(SCHEME)


def _root() -> Path:
    return Path(str(resources.files("fedtune") / "assets" / "bases"))


def available() -> list[str]:
    """The names of the shipped bases."""
    root = _root()
    return sorted(p.name for p in root.iterdir() if (p / "config.json").is_file()) if root.is_dir() else []


def base_dir(uri: str) -> str:
    """The folder a ``builtin://NAME`` URI names.

    Raises:
        ModelError: No base of that name ships with this fedtune.
    """
    name = uri.removeprefix(SCHEME).strip("/")
    if name not in available():
        raise ModelError(
            f"model {uri!r}: no base named {name!r} ships with this fedtune "
            f"(it has {', '.join(available()) or 'none'})",
            fix=f"Use one of {', '.join(SCHEME + n for n in available())}, or a folder or s3:// URI.",
        )
    return str(_root() / name)
