"""A wrong input path says what happened, with the value, and a fix naming the input that
gave it: the job's data_uri, partition's INPUT, audit's --data and MODEL, never a job field for
a command-line argument nor "run the step that writes it" for a user's own file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from fedtune.cli.main import main
from fedtune.config import parse_job
from fedtune.core.errors import FedtuneError, StoreError
from fedtune.engines import steps
from tests.integration.conftest import DATA, tiny_job_dict

JOB_WORDS = ("data_uri", "model.uri", "job's", "job file")  # what only a job file has
STEP_WORDS = "run the step that writes it"
RECORD = {"instruction": "Reverse the word: cat", "input": "", "output": "tac"}


def _bad_path(tmp_path: Path, kind: str) -> Path:
    """A data path that is missing, or a folder (holding a JSONL file, as data folders do)."""
    if kind == "missing":
        return tmp_path / "nowhere" / "train.jsonl"
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "train.jsonl").write_text(json.dumps(RECORD) + "\n")
    return folder


def _via_job(path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> FedtuneError:
    job = parse_job(tiny_job_dict(tmp_path / "w"))
    job = job.model_copy(update={"tenants": [
        job.tenants[0].model_copy(update={"data_uri": str(path)}), *job.tenants[1:]]})
    with pytest.raises(FedtuneError) as info:
        steps.TenantEnv.create(job, "tenant-a").data()
    return info.value


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err.replace("\n", " ")


def _via_partition(path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    outs = ["--out", f"a={tmp_path / 'a.jsonl'}", "--out", f"b={tmp_path / 'b.jsonl'}"]
    code, err = _cli(["partition", str(path), "--strategy", "iid", *outs], capsys)
    assert code == StoreError.exit_code
    assert not (tmp_path / "a.jsonl").exists()  # nothing half-written
    return err


def _via_audit(path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    code, err = _cli(["audit", "memorization", str(tmp_path), "--data", str(path)], capsys)
    assert code == StoreError.exit_code
    return err


@pytest.mark.parametrize("kind", ["missing", "folder"])
@pytest.mark.parametrize(
    ("reader", "named"),
    [(_via_job, "data_uri"), (_via_partition, "INPUT"), (_via_audit, "--data")],
    ids=["job-data_uri", "partition-INPUT", "audit---data"],
)
def test_a_missing_or_folder_dataset_is_named_with_a_fix(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    reader: Callable[..., object],
    named: str,
    kind: str,
) -> None:
    path = _bad_path(tmp_path, kind)
    said = reader(path, tmp_path, capsys)
    text = said.render() if isinstance(said, FedtuneError) else str(said)
    happened = "is a folder, not a dataset file" if kind == "folder" else "no such file"
    assert f"{named} {str(path)!r}" in text and happened in text
    fix = {"folder": f"fix: Point {named} at one dataset file in it (e.g. train.jsonl)",
           "missing": f"fix: Check the path given as {named}"}[kind]
    assert fix in text
    assert "no blob at key" not in text and STEP_WORDS not in text
    if named != "data_uri":
        assert not any(word in text for word in JOB_WORDS)


def _no_config(model: Path) -> None:
    model.mkdir()


def _no_weights(model: Path) -> None:
    model.mkdir()
    (model / "config.json").write_text("{}")


def _no_tokenizer(model: Path) -> None:
    _no_weights(model)
    (model / "model.safetensors").write_bytes(b"")


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda m: None, "does not exist"),
        (_no_config, "has no config.json"),
        (_no_weights, "has no weights"),
        (_no_tokenizer, "has no tokenizer files"),
    ],
    ids=["missing", "no-config", "no-weights", "no-tokenizer"],
)
def test_audit_model_errors_name_the_argument_not_job_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Callable[[Path], None], says: str
) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(RECORD) + "\n")
    model = tmp_path / "model"
    make(model)
    code, err = _cli(["audit", "memorization", str(model), "--data", str(data)], capsys)
    assert code == 8 and says in err and str(model) in err and "fix:" in err
    assert not any(word in err for word in JOB_WORDS), err


def test_an_empty_dataset_fix_names_no_job_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code, err = _cli(["audit", "memorization", str(tmp_path), "--data", str(empty)], capsys)
    assert code == 3 and "holds no records" in err and "fix:" in err
    assert not any(word in err for word in JOB_WORDS), err


def test_partition_into_one_tenant_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "a.jsonl"
    code, err = _cli(
        ["partition", str(DATA / "tenant-a.jsonl"), "--strategy", "iid", "--out", f"a={out}"], capsys
    )
    assert code == 2 and "--out names 1 tenant (a)" in err
    assert "fix: Repeat --out once per tenant" in err
    assert not out.exists()
