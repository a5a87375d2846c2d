"""Which source a benchmark result came from: the git commit of the fedtune checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path


def source_commit() -> str | None:
    """The commit of the checkout this package runs from (``+dirty`` with uncommitted
    changes under ``src/``), or None outside a git checkout."""
    root = Path(__file__).resolve().parents[3]
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "src"],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{commit}+dirty" if dirty else commit
