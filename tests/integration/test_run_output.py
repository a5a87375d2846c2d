"""``fedtune run`` through a pipe, as a pod's log or ``> file`` gets it: lines as they happen."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import tiny_job_dict

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "COLUMNS": "80"}
    return subprocess.Popen(
        [sys.executable, "-m", "fedtune.cli.main", *args], cwd=cwd, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


@pytest.mark.slow
def test_a_piped_run_streams_a_line_per_step_and_round_and_says_how_to_continue(
    tmp_path: Path,
) -> None:
    job = tiny_job_dict(tmp_path / "work", rounds=3)
    job["training"]["local_steps"] = 1
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job), encoding="utf-8")
    summary = tmp_path / "work" / "runs" / "itest" / "summary.json"

    run = _start(["run", "job.yaml", "--until-round", "2"], tmp_path)
    assert run.stdout is not None
    lines: list[str] = []
    for line in run.stdout:  # read as the run writes, not after it ended
        lines.append(line.rstrip("\n"))
        if "round 1/3 done" in line:
            # Round 2 is still to run: the line came while the run went on.
            assert run.poll() is None and not summary.exists()
            break
    else:
        pytest.fail(f"no round line before the run ended: {lines}; {run.stderr.read()}")
    rest, err = run.communicate(timeout=300)
    assert run.returncode == 0, err
    lines += rest.splitlines()
    steps = [line for line in lines if "client step done" in line]
    assert len(steps) == 6 and all(": tenant-" in s for s in steps)
    assert lines.index(next(s for s in lines if "round 1/3 done" in s)) == 3  # after 3 steps
    # Nothing is hard-wrapped at the 80 columns rich assumes off a terminal: a long path and
    # a long sentence stay on one line each.
    assert f"summary: {summary}" in lines and len(str(summary)) > 80
    assert any(line.startswith("partial run: 2 of 3 rounds done (--until-round); the final "
                               "evaluation, export and registration have not run") for line in lines)
    command = lines[-1]
    assert command == "fedtune run job.yaml --resume"

    # The printed command continues the run; as JSON lines for a log collector this time.
    words = shlex.split(command)
    resumed = _start([*words[1:], "--log-format", "json"], tmp_path)
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]  # every line is one object
    assert [e["event"] for e in events] == [
        *["tenant_step"] * 3, "round", *["tenant_step"] * 3, "summary"
    ]
    assert events[3]["round"] == 3 and events[3]["accepted"] == 3
    assert [e["kind"] for e in events[4:7]] == ["evaluate"] * 3
    assert events[-1]["completed"] is True and json.loads(summary.read_text())["completed"]
    for line in err.splitlines():  # log records on stderr are JSON too
        assert json.loads(line)["level"]


@pytest.mark.parametrize(
    ("value", "message"),
    [("0", "0 threads: use 1 to 1024"), ("2000", "2000 threads: use 1 to 1024"),
     ("many", "'many' is not a number of threads")],
)
def test_a_bad_thread_count_is_refused_before_anything_runs(
    value: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedtune.cli.main import main

    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(tiny_job_dict(tmp_path / "work")), encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(job), "--threads", value])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "work").exists()


def test_a_failed_step_and_a_rejected_update_are_on_their_lines() -> None:
    from fedtune.cli.run_log import text_line

    step = {"event": "tenant_step", "round": 2, "rounds": 3, "kind": "client",
            "tenant": "tenant-b", "ok": False, "seconds": None,
            "failure": "client step failed: DataError: bad record"}
    assert text_line(step) == (
        "round 2/3: tenant-b client step failed: client step failed: DataError: bad record"
    )
    final = {**step, "kind": "evaluate", "ok": True, "seconds": 1.25, "failure": None}
    assert text_line(final) == "final: tenant-b evaluate step done in 1.2 s"
    round_event = {"event": "round", "round": 2, "rounds": 3, "sampled": 3, "accepted": 2,
                   "rejected": {"tenant-b": "no update"}, "train_loss": 1.5,
                   "eval_loss": None, "seconds": 4.0}
    assert text_line(round_event) == (
        "round 2/3 done: 2/3 tenants accepted, train loss 1.5000, eval loss -, 4.0 s; "
        "tenant-b rejected: no update"
    )


@pytest.mark.parametrize("valid", [True, False], ids=["ok", "error"])
def test_the_console_script_skips_the_teardown_walk_but_keeps_exit_code_and_atexit(
    valid: bool, tmp_path: Path
) -> None:
    """``fedtune`` freezes what the process holds once the command is done (Python's last
    collections would walk it for about a second), and nothing a user sees changes: the
    exit code, the error and fix lines, and every atexit handler (logging, MLflow, pools)."""
    job = tmp_path / "job.yaml"
    if valid:
        job.write_text(yaml.safe_dump(tiny_job_dict(tmp_path / "work")), encoding="utf-8")
    probe = (
        "import atexit, gc, sys\n"
        "from fedtune.cli.main import console\n"
        "atexit.register(lambda: print('atexit ran; frozen:', gc.get_freeze_count() > 0))\n"
        f"sys.argv = ['fedtune', 'validate', {str(job)!r}]\n"
        "sys.exit(console())\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert "atexit ran; frozen: True" in done.stdout
    if valid:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode != 0 and "error:" in done.stderr and "fix:" in done.stderr
