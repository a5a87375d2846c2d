"""``--set FIELD.PATH=VALUE`` overrides on validate, run and compile."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fedtune.cli.main import main
from fedtune.config import load_job
from fedtune.core.errors import ConfigError
from tests.unit.config.test_job_config import VALID as JOB


@pytest.fixture
def job_file(tmp_path: Path) -> Path:
    folder = tmp_path / "jobs"
    folder.mkdir()
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(JOB), encoding="utf-8")
    return path


def test_values_are_read_as_yaml(job_file: Path) -> None:
    job = load_job(
        job_file,
        ["training.lr=0.01", "rounds=5", "lora.target_modules=[q_proj, v_proj]", "name=other"],
    )
    assert job.training.lr == 0.01 and job.rounds == 5 and job.name == "other"
    assert list(job.lora.target_modules) == ["q_proj", "v_proj"]


def test_tenant_by_name_or_position_and_paths_relative_to_cwd(
    job_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    job = load_job(job_file, ["tenants.tenant-b.data_uri=mine.jsonl", "tenants.0.data_uri=s3://b/a"])
    assert job.tenants[1].data_uri == str(tmp_path / "mine.jsonl")  # the shell's directory
    assert job.tenants[0].data_uri == "s3://b/a"
    untouched = load_job(job_file)
    assert untouched.tenants[0].data_uri == str(job_file.parent / "a.jsonl")  # the file's


def test_the_last_of_two_overrides_wins(job_file: Path) -> None:
    assert load_job(job_file, ["rounds=2", "rounds=4"]).rounds == 4


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("training.lr", "is not of the form FIELD.PATH=VALUE"),
        ("=3", "is not of the form FIELD.PATH=VALUE"),
        ("training..lr=3", "is not of the form FIELD.PATH=VALUE"),
        ("name=[unclosed", "is not valid YAML"),
        ("tenants.7.data_uri=x", "tenants has 2 entries, so there is no entry 7"),
        ("tenants.tenant-z.data_uri=x", "no entry named 'tenant-z'"),
        ("rounds.every=2", "rounds is int 3, which has no field 'every'"),
    ],
)
def test_malformed_override_is_refused_with_the_text(
    job_file: Path, override: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_job(job_file, [override] if "rounds.every" not in override else ["rounds=3", override])
    assert fragment in str(info.value) and info.value.fix


def test_misspelt_or_mistyped_override_is_reported_like_the_file(job_file: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_job(job_file, ["training.lrr=0.1", "rounds=true"])
    text = str(info.value)
    assert "2 problem(s)" in text
    assert "training.lrr: Extra inputs are not permitted" in text
    assert "rounds: expected a number, got the boolean true" in text


@pytest.mark.parametrize("command", ["validate", "run", "compile"])
def test_every_job_command_takes_set(
    command: str, job_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = ["-o", str(job_file.with_suffix(".pipeline.yaml"))] if command == "compile" else []
    code = main([command, str(job_file), "--set", "rounds=oops", *extra])
    assert code == 2
    assert "rounds: expected an integer, got the string 'oops'" in capsys.readouterr().err


def test_a_hub_id_given_by_set_stays_a_hub_id(job_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no folder Qwen/ here
    raw = {**JOB, "model": {"source": "pretrained", "uri": "m", "tenant_uri": "m"}}
    job_file.write_text(yaml.safe_dump(raw), encoding="utf-8")
    job = load_job(job_file, ["model.uri=Qwen/Qwen2.5-0.5B"])
    assert job.model.uri == "hf://Qwen/Qwen2.5-0.5B"


def test_the_command_that_continues_a_run_keeps_its_overrides(
    job_file: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Resuming without the same --set would be refused as a changed job."""
    from tests.integration.conftest import tiny_job_dict

    job = tiny_job_dict(tmp_path / "w", rounds=2)
    job_file.write_text(yaml.safe_dump(job), encoding="utf-8")
    code = main(["run", str(job_file), "--set", "training.lr=0.002", "--until-round", "1",
                 "--no-progress"])
    assert code == 0
    said = capsys.readouterr().out.replace("\n", " ")
    assert "--resume --set training.lr=0.002" in said
