"""A SIGKILLed ``fedtune run --workers 2`` leaves no process behind: its fork server and
workers end within a second or two, whether they were importing torch or training."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from fedtune.engines.parent_death import set_parent_death_signal
from tests.integration.conftest import tiny_job_dict
from tests.integration.crash_helpers import fedtune_env, kill_when, start

GONE_WITHIN_S = 2.0


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running; a zombie (dead, waiting for a reaper) counts as gone."""
    out = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _left_after(descendants: list[psutil.Process]) -> list[str]:
    deadline = time.monotonic() + GONE_WITHIN_S
    while (alive := _alive(descendants)) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [f"{p.pid} {' '.join(_cmdline(p))[:120]}" for p in alive]
    for p in alive:  # do not leave them to the next test
        p.kill()
    return left


def _job(tmp_path: Path, local_steps: int) -> Path:
    job = tiny_job_dict(tmp_path / "w", rounds=1)
    job["training"]["local_steps"] = local_steps
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    return path


def _training(workdir: Path) -> bool:
    """Round 1's broadcast reached the tenants: the workers are training."""
    return any(workdir.glob("exchange/**/tenant-*/round-000001/broadcast.json"))


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["fork-server-importing", "workers-training"])
def test_a_killed_engine_takes_its_fork_server_and_workers_with_it(
    tmp_path: Path, moment: str
) -> None:
    # Training long enough (hundreds of steps) that a surviving worker would still train.
    proc = start(["run", str(_job(tmp_path, local_steps=400)), "--no-progress", "--workers", "2"])
    engine = psutil.Process(proc.pid)

    descendants: list[psutil.Process] = []

    def ready() -> bool:
        nonlocal descendants
        descendants = engine.children(recursive=True)
        if moment == "fork-server-importing":
            return any("forkserver" in " ".join(_cmdline(k)) for k in descendants)
        if len(descendants) < 3 or not _training(tmp_path / "w"):  # fork server, 2 workers
            return False
        time.sleep(0.3)  # into the step
        return True

    kill_when(proc, ready, timeout=120)  # SIGKILL
    proc.wait(timeout=10)
    left = _left_after(descendants)
    proc.communicate(timeout=10)  # its pipes close once every holder is gone
    assert descendants
    assert not list((tmp_path / "w").glob("exchange/**/update.json")), "killed after training"
    assert left == []


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _python(code: str) -> psutil.Popen:
    return psutil.Popen([sys.executable, "-c", code], env=fedtune_env())


@pytest.mark.parametrize("guard", ["parent-death-signal", "orphan-watch"])
def test_a_guarded_child_dies_with_its_parent(tmp_path: Path, guard: str) -> None:
    # parent -> child (guarded); SIGKILL the parent, the child must follow.
    setup = (
        "from fedtune.engines.parent_death import set_parent_death_signal; "
        "set_parent_death_signal()"
        if guard == "parent-death-signal"
        else "from fedtune.engines.parent_death import exit_when_orphaned; exit_when_orphaned()"
    )
    ready = tmp_path / "guarded"
    child = f"{setup}; open({str(ready)!r}, 'w').close(); import time; time.sleep(60)"
    parent = _python(
        f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); "
        "time.sleep(60)"
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        kids = parent.children()
        assert ready.exists() and _alive(kids), "the guarded child did not start, or ended on its own"
        parent.kill()
        parent.wait(timeout=10)
        assert kids and _left_after(kids) == []
    finally:
        if parent.is_running():
            parent.kill()


def test_no_parent_death_signal_off_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.platform", "darwin")
    assert set_parent_death_signal() is False
