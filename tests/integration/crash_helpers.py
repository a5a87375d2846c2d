"""Run ``fedtune`` in a subprocess and kill it at a chosen moment, as a user's crash would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import fedtune
from fedtune.engines.parent_death import ENGINE_PID_ENV

SRC = Path(fedtune.__file__).resolve().parents[1]


def fedtune_env(**extra: str) -> dict[str, str]:
    """The environment of a child ``fedtune``: this checkout's sources, no MLflow URI, and
    no engine to watch: an engine an earlier test ran in this process named itself in
    ``$FEDTUNE_ENGINE_PID``, and a child that inherited it would take this process for its
    parent and end itself at once (``parent_death.exit_when_orphaned``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", ENGINE_PID_ENV)}
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def start(args: list[str], **env: str) -> subprocess.Popen[str]:
    """Start ``fedtune ARGS`` in the background."""
    return subprocess.Popen(
        [sys.executable, "-m", "fedtune.cli.main", *args],
        env=fedtune_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run(args: list[str], timeout: float = 240, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``fedtune ARGS`` to its end."""
    return subprocess.run(
        [sys.executable, "-m", "fedtune.cli.main", *args],
        env=fedtune_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def kill_when(
    proc: subprocess.Popen[str], ready: Callable[[], bool], sig: int = signal.SIGKILL,
    timeout: float = 240,
) -> None:
    """Send ``sig`` to ``proc`` as soon as ``ready()`` holds (polled every few ms)."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"fedtune ended (rc {proc.returncode}) before the kill point:\n{err}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the kill point was never reached")
        time.sleep(0.002)
    proc.send_signal(sig)
