"""Which code produced a result: the git commit of the source tree, named in every results
JSON so that a generated table can say what it measured."""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["source_commit"]


def source_commit() -> str:
    """The short commit of the checkout this package runs from, ``+dirty`` when it has
    uncommitted changes, or ``unknown`` outside a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here, capture_output=True, text=True, check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")
