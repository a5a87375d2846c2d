"""The content hash of an exported model folder: what makes a registration idempotent."""

from __future__ import annotations

import hashlib
from pathlib import Path

#: Version tags that identify one training's export: the run and the exported bytes.
RUN_TAG = "fedtune.run_id"
CONTENT_TAG = "fedtune.content_sha256"


def folder_sha256(folder: Path) -> str:
    """sha256 over every file's relative path and bytes, in sorted order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        digest.update(b"\0")
    return digest.hexdigest()
