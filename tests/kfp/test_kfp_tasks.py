"""kfp.local tasks forked from the warm server: outputs, a process per task, failures reported."""

from __future__ import annotations

import builtins
import os
from pathlib import Path
from typing import Any

import pytest

from fedtune.pipelines.kfp_tasks import forked_tasks


def test_a_forked_task_runs_in_its_own_process_and_returns_its_output(tmp_path: Path) -> None:
    from kfp import local

    from tests.kfp.forked_components import write_pid

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    printer = builtins.print
    try:
        with forked_tasks():
            task = write_pid(path=str(tmp_path / "pid"))
    finally:
        builtins.print = printer
    assert task.output == "hello from a forked task"
    pid, flag, warm = (tmp_path / "pid").read_text().split()
    assert int(pid) != os.getpid() and flag == "true" and warm == "True"


def _failing_run(tmp_path: Path, component: Any, **arguments: Any) -> None:
    """Run ``component`` as a forked task that must fail the run."""
    from kfp import local

    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(tmp_path / "root"),
        raise_on_error=True,
    )
    printer = builtins.print
    try:
        with forked_tasks(), pytest.raises(RuntimeError, match="FAILURE"):
            component(**arguments)
    finally:
        builtins.print = printer


def test_a_failing_forked_task_fails_the_run_and_prints_its_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.kfp.forked_components import fail

    _failing_run(tmp_path, fail, message="the step broke: fix the job")
    out = capsys.readouterr().out
    assert "ValueError: the step broke: fix the job" in out
    assert "fedtune: the task's process ended with exit status 1" in out


def test_a_task_killed_by_a_signal_says_which(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.kfp.forked_components import killed

    _failing_run(tmp_path, killed)
    assert "fedtune: the task's process ended with signal SIGKILL" in capsys.readouterr().out
