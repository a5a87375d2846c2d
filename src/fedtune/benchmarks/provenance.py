"""Which code produced a benchmark's numbers: the checked-out commit, recorded in its JSON."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["git_commit", "provenance", "source_commit"]


def git_commit(cwd: str | Path | None = None) -> str | None:
    """The short commit checked out at ``cwd``, with ``+dirty`` when tracked files differ
    from it (then the numbers come from uncommitted code); None outside a git tree."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=cwd, capture_output=True, text=True, check=True, timeout=10,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd, capture_output=True, text=True, check=True, timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def source_commit() -> str:
    """The commit of the code this package runs: ``FEDTUNE_SOURCE_COMMIT`` where the sender of
    a copy set it (a container image's build, a copy on a GPU machine, whose ``.git`` can be
    older than the files beside it: the first GPU lease's copy said ``92b84fe+dirty`` while
    running 2f666cf), else the checkout's (see :func:`git_commit`), else ``unknown``."""
    named = os.environ.get("FEDTUNE_SOURCE_COMMIT", "").strip()
    return named or git_commit(Path(__file__).resolve().parent) or "unknown"


def provenance(command: str) -> dict[str, Any]:
    """``measured_at_commit`` (the code's commit, see :func:`git_commit`) and ``command``."""
    return {"measured_at_commit": source_commit(), "command": command}
