"""A corrupted server state: the printed fix, followed as written, lets the run resume.

The fix used to say "delete it", which left the state's ``.json`` half behind; that half
alone marks the round as done, so the resumed run failed on the missing tensors.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from fedtune.cli.main import main
from tests.integration.conftest import tiny_job_dict

STATE = Path("provider/jobs/itest/state")


def test_following_the_printed_fix_resumes_to_the_same_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    straight = tmp_path / "straight.yaml"
    straight.write_text(yaml.safe_dump(tiny_job_dict(tmp_path / "s")), encoding="utf-8")
    assert main(["run", str(straight), "--no-progress"]) == 0
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(tiny_job_dict(tmp_path / "w")), encoding="utf-8")
    assert main(["run", str(path), "--no-progress", "--until-round", "1"]) == 0
    damaged = tmp_path / "w" / STATE / "round-000001.safetensors"
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0xFF
    damaged.write_bytes(bytes(data))
    capsys.readouterr()

    assert main(["run", str(path), "--no-progress", "--resume"]) == 5
    err = capsys.readouterr().err
    assert "does not match its checksum" in err
    command = re.search(r"`([^`]+)`", err.split("fix:", 1)[1])
    assert command is not None, err
    assert command.group(1).count(str(tmp_path / "w" / STATE)) == 4  # both halves, both sidecars
    subprocess.run(command.group(1), shell=True, check=True)  # noqa: S602 (the printed fix)

    assert main(["run", str(path), "--no-progress", "--resume"]) == 0, capsys.readouterr().err
    final = "round-000002.safetensors"
    assert (tmp_path / "w" / STATE / final).read_bytes() == (tmp_path / "s" / STATE / final).read_bytes()
