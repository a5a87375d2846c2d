"""scripts/servers/: what they do when a tool is missing or the work is already done, and when
the real-server tests skip rather than fail."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers.servers import INSTALL_MINIO, REQUIRE_ENV, unavailable

NO_GO_PATH = "/usr/bin:/bin"  # Go lives in /usr/local/go/bin or ~/go/bin, never here


def run_install(cache: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": NO_GO_PATH, "HOME": str(cache), "FEDTUNE_SERVERS_CACHE": str(cache)}
    return subprocess.run(
        ["bash", str(INSTALL_MINIO)], env=env, capture_output=True, text=True, timeout=60,
        check=False,
    )


def test_install_minio_without_go_says_what_to_do(tmp_path: Path) -> None:
    proc = run_install(tmp_path)
    assert proc.returncode == 3
    assert "no 'go' on PATH" in proc.stderr and "fix: install Go" in proc.stderr
    assert proc.stdout == ""


def test_install_minio_reuses_the_binary_of_its_version_without_building(tmp_path: Path) -> None:
    version = subprocess.run(
        ["bash", str(INSTALL_MINIO), "--print-version"], capture_output=True, text=True,
        check=True, timeout=60,
    ).stdout.strip()
    cached = tmp_path / "minio" / version / "minio"
    cached.parent.mkdir(parents=True)
    # Stands in for a binary built earlier: it answers --version, as the script checks.
    cached.write_text("#!/bin/sh\necho 'minio version test'\n")
    cached.chmod(0o755)
    proc = run_install(tmp_path)  # no Go on PATH: reuse is the only way to succeed
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(cached)


def test_a_binary_that_does_not_run_is_rebuilt_not_reused(tmp_path: Path) -> None:
    version = subprocess.run(
        ["bash", str(INSTALL_MINIO), "--print-version"], capture_output=True, text=True,
        check=True, timeout=60,
    ).stdout.strip()
    cached = tmp_path / "minio" / version / "minio"
    cached.parent.mkdir(parents=True)
    cached.write_text("#!/bin/sh\nexit 1\n")  # a truncated or foreign-arch file
    cached.chmod(0o755)
    assert run_install(tmp_path).returncode == 3  # it wanted to build (and had no Go)


@pytest.mark.parametrize(
    ("required", "installable", "outcome"),
    [
        ("", True, pytest.skip.Exception),
        ("1", False, pytest.skip.Exception),  # not root: make servers could not install it
        ("1", True, pytest.fail.Exception),  # make test promised it: never a silent skip
    ],
)
def test_a_missing_server_skips_only_where_it_could_not_have_been_provided(
    monkeypatch: pytest.MonkeyPatch, required: str, installable: bool, outcome: type
) -> None:
    monkeypatch.setenv(REQUIRE_ENV, required)
    with pytest.raises(outcome, match="PostgreSQL is missing"):
        unavailable("PostgreSQL is missing", installable=installable)
