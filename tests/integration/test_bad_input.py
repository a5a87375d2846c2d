"""Bad command-line input: a clear message, the documented exit code, nothing written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedtune.cli.main import main
from tests.integration.conftest import tiny_job_dict


def write(tmp_path: Path, job: dict[str, Any]) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_until_round_below_one_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    job = write(tmp_path, tiny_job_dict(tmp_path / "w"))
    with pytest.raises(SystemExit) as info:
        main(["run", job, "--until-round", value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--until-round" in err and value in err and "1 or more" in err
    assert not (tmp_path / "w").exists()


def test_workdir_that_is_a_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "w").write_text("not a folder")
    job = write(tmp_path, tiny_job_dict(tmp_path / "w", rounds=1))
    assert main(["run", job, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "is a file" in err and str(tmp_path / "w") in err and "fix:" in err
    assert main(["validate", job, "--deep"]) == 2


def test_summary_json_naming_a_folder_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    job = write(tmp_path, tiny_job_dict(tmp_path / "w", rounds=1))
    assert main(["run", job, "--no-progress", "--summary-json", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "is a folder" in err and str(folder / "summary.json") in err
    assert not (tmp_path / "w").exists()  # refused before the run started


@pytest.mark.parametrize("k", ["one", "0", "1,x"])
def test_eval_humaneval_bad_k_is_a_clean_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], k: str
) -> None:
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"task_id": "HumanEval/0", "completion": "x"}) + "\n")
    with pytest.raises(SystemExit) as info:
        main(["eval", "humaneval", "--completions", str(samples), "--k", k])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--k" in err and "Traceback" not in err


def test_tiny_tenant_warns_in_the_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tiny_job_dict(tmp_path / "w", rounds=1)
    source = Path(job["tenants"][0]["data_uri"]).read_text().splitlines()
    small = tmp_path / "small.jsonl"
    small.write_text("\n".join(source[:3]) + "\n")
    job["tenants"][0]["data_uri"] = str(small)
    summary_path = tmp_path / "s.json"
    assert main(["run", write(tmp_path, job), "--no-progress", "--summary-json", str(summary_path)]) == 0
    warnings = json.loads(summary_path.read_text())["warnings"]
    assert any("tenant-a" in w and "batch_size=4" in w for w in warnings), warnings
    assert any("tenant-a" in w and "no held-out records" in w for w in warnings), warnings
    assert "warning: tenant tenant-a" in capsys.readouterr().out
