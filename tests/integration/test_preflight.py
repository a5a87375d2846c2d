"""Preflight: a job that cannot run fails before anything is stored, with its exit code."""

from __future__ import annotations

import time
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


def stored(tmp_path: Path) -> list[str]:
    provider = tmp_path / "w" / "provider"
    return sorted(str(p.relative_to(provider)) for p in provider.rglob("*") if p.is_file())


def test_bad_lora_targets_fail_before_anything_is_stored_and_do_not_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tiny_job_dict(tmp_path / "w", rounds=1)
    job["lora"]["target_modules"] = ["query"]
    assert main(["validate", write(tmp_path, job), "--deep"]) == 8
    assert "query" in capsys.readouterr().err
    assert main(["run", write(tmp_path, job), "--no-progress"]) == 8
    err = capsys.readouterr().err
    assert "'query'" in err and "q_proj" in err and "fix:" in err
    assert stored(tmp_path) == []
    del job["lora"]["target_modules"]
    assert main(["run", write(tmp_path, job), "--no-progress"]) == 0  # a plain run, no --fresh


def test_bad_data_exits_3_with_the_kind_fix_and_a_plain_run_follows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "a", "output": "b"}\nnot json\n')
    job = tiny_job_dict(tmp_path / "w", rounds=1)
    good = job["tenants"][0]["data_uri"]
    job["tenants"][0]["data_uri"] = str(bad)
    assert main(["validate", write(tmp_path, job), "--deep"]) == 3
    capsys.readouterr()
    assert main(["run", write(tmp_path, job), "--no-progress"]) == 3
    err = capsys.readouterr().err
    assert "Correct the named record" in err and "line 2" in err
    assert stored(tmp_path) == []
    job["tenants"][0]["data_uri"] = good
    assert main(["run", write(tmp_path, job), "--no-progress"]) == 0


def test_missing_tokenizer_is_found_by_validate_deep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tiny_job_dict(tmp_path / "w", rounds=1, tokenizer=str(tmp_path / "no-tokenizer"))
    assert main(["validate", write(tmp_path, job)]) == 0  # the shallow check reads no files
    capsys.readouterr()
    assert main(["validate", write(tmp_path, job), "--deep"]) == 8
    assert "no-tokenizer" in capsys.readouterr().err


def test_unreachable_tracking_server_fails_within_seconds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tiny_job_dict(tmp_path / "w", rounds=1)
    job["tracking"] = {"backend": "mlflow", "tracking_uri": "http://127.0.0.1:9"}
    started = time.monotonic()
    assert main(["run", write(tmp_path, job), "--no-progress"]) == 4
    assert time.monotonic() - started < 30
    err = capsys.readouterr().err
    assert "http://127.0.0.1:9" in err and "does not answer" in err
    assert stored(tmp_path) == []


def test_a_run_json_without_any_state_does_not_block_a_plain_run(tmp_path: Path) -> None:
    job = tiny_job_dict(tmp_path / "w", rounds=1)
    leftover = tmp_path / "w" / "provider" / "jobs" / "itest"
    leftover.mkdir(parents=True)
    (leftover / "run.json").write_text('{"fingerprint": "old", "run_id": null, "job": "itest"}')
    assert main(["run", write(tmp_path, job), "--no-progress"]) == 0


def test_validate_deep_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", write(tmp_path, tiny_job_dict(tmp_path / "w")), "--deep"]) == 0
    assert "ok" in capsys.readouterr().out
    assert stored(tmp_path) == []
