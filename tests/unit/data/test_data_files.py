"""Datasets as JSON, CSV, Parquet and save_to_disk folders read like the JSON Lines file.

The same records are written in every container; what a tenant trains on (the examples),
what ``partition`` writes and the error messages must not depend on the container.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import datasets
import pytest

from fedtune.cli.main import main
from fedtune.config.job import LimitsConfig
from fedtune.core.errors import DataError
from fedtune.data.jsonl import write_jsonl
from fedtune.data.loader import read_examples, read_numbered_examples, read_records
from tests.helpers.moto import admin_client, create_bucket, use_fake_aws_env
from tests.unit.storage.conftest import moto_endpoint  # noqa: F401 (the session's S3 server)

RECORDS = [
    {"instruction": "Add 40 and 2.", "input": "", "output": "42"},
    {"instruction": "Reverse the word.", "input": "naïve, \"quoted\"\nline", "output": "evïan"},
    {"instruction": "Say hi.", "input": "", "output": "Hi"},
    {"instruction": "Count the a's.", "input": "banana", "output": "3"},
]
CHATS = [
    {"messages": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]},
    {"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": "5"}, {"role": "user", "content": "and 2*3?"},
        {"role": "assistant", "content": "6"},
    ]},
]


def _csv(records: list[dict[str, str]], path: Path) -> None:
    datasets.Dataset.from_list(records).to_csv(str(path), index=False)


def _folder(records: list[dict[str, object]], path: Path) -> None:
    # Two shards, so that the folder's state.json lists several Arrow files.
    datasets.Dataset.from_list(records).save_to_disk(str(path), num_shards=2)


WRITERS: dict[str, Callable[[list, Path], None]] = {
    "data.jsonl": lambda r, p: p.write_bytes(write_jsonl(r)),
    "data.json": lambda r, p: p.write_text(json.dumps(r), encoding="utf-8"),
    "data.csv": _csv,
    "data.parquet": lambda r, p: datasets.Dataset.from_list(r).to_parquet(str(p)),
    "folder": _folder,
}


def _write(tmp_path: Path, name: str, records: list) -> Path:
    path = tmp_path / name
    WRITERS[name](records, path)
    return path


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_every_container_gives_the_records_and_examples_of_the_jsonl_file(
    tmp_path: Path, name: str
) -> None:
    reference = read_examples(str(_write(tmp_path, "data.jsonl", RECORDS)))
    path = _write(tmp_path, name, RECORDS)
    assert read_records(str(path)) == RECORDS
    assert read_examples(path.as_uri()) == reference
    assert [n for n, _ in read_numbered_examples(str(path))] == [1, 2, 3, 4]


@pytest.mark.parametrize("name", ["data.jsonl", "data.json", "data.parquet", "folder"])
def test_chat_records_in_every_container_that_holds_lists(tmp_path: Path, name: str) -> None:
    examples = read_examples(str(_write(tmp_path, name, CHATS)), "chat")
    assert examples[1].messages == (
        ("system", "Be brief."), ("user", "2+3?"), ("assistant", "5"),
        ("user", "and 2*3?"), ("assistant", "6"),
    )
    assert (examples[1].instruction, examples[1].response) == ("and 2*3?", "6")
    assert read_examples(str(tmp_path / name)) == examples  # detected from "messages"


def test_a_folder_uri_may_end_in_a_slash(tmp_path: Path) -> None:
    path = _write(tmp_path, "folder", RECORDS)
    assert read_records(str(path) + "/") == RECORDS


def _partition(folder: Path, name: str, records: list) -> list[bytes]:
    folder.mkdir()
    outs = [f"{t}={folder / f'{t}.jsonl'}" for t in ("a", "b")]
    args = ["partition", str(_write(folder, name, records)), "--strategy", "dirichlet",
            "--field", "category", "--alpha", "0.5", "--seed", "3"]
    assert main([*args, *[x for o in outs for x in ("--out", o)]]) == 0
    return [Path(o.split("=", 1)[1]).read_bytes() for o in outs]


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_partition_takes_every_container_and_writes_the_same_bytes(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    records = [{**r, "category": c} for r in RECORDS for c in ("x", "y")]
    written = _partition(tmp_path / "got", name, records)
    assert written == _partition(tmp_path / "reference", "data.jsonl", records)
    assert sum(len(part.splitlines()) for part in written) == len(records)
    assert "a: " in capsys.readouterr().out


def test_format_error_names_the_row(tmp_path: Path) -> None:
    path = tmp_path / "data.parquet"
    datasets.Dataset.from_list([RECORDS[0], {"instruction": "x", "input": "", "output": None}]).to_parquet(str(path))
    with pytest.raises(DataError, match=r"data.parquet, row 2: alpaca record is missing required field\(s\) output") as raised:
        read_examples(str(path))
    assert raised.value.record == 2


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("bad.parquet", b"PAR1 not really", "cannot read it as PARQUET"),
        ("bad.json", b'[{"instruction": "a", ', "cannot read it as JSON"),
        ("bad.csv", b'instruction,output\n"a,b\n', "cannot read it as CSV"),
        ("dup.csv", b"instruction,instruction\na,b\n", "must name each column once, got ['instruction', 'instruction']"),
        ("empty.csv", b"", "must name each column once, got []"),
    ],
)
def test_unreadable_files_say_what_and_how_to_fix(
    tmp_path: Path, name: str, content: bytes, expected: str
) -> None:
    (tmp_path / name).write_bytes(content)
    with pytest.raises(DataError) as raised:
        read_records(str(tmp_path / name))
    assert expected in str(raised.value) and name in str(raised.value)
    assert raised.value.fix and raised.value.exit_code != 0


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"state.json": b'{"_data_files": [{"filename": "../../secret.arrow"}]}'}, "'../../secret.arrow'"),
        ({"state.json": b'{"_data_files": [{"filename": "/etc/passwd"}]}'}, "'/etc/passwd'"),
        ({"state.json": b"{not json"}, "state.json is not valid JSON"),
        ({"state.json": b'{"_data_files": [{"filename": "data-0.arrow"}]}'}, "cannot read data-0.arrow"),
        ({"state.json": b'{"_data_files": [{"filename": "data-0.arrow"}]}', "data-0.arrow": b"junk"},
         "cannot read data-0.arrow"),
        ({"dataset_dict.json": b'{"splits": ["train", "test"]}'}, "splits ['train', 'test']"),
    ],
)
def test_broken_or_escaping_folders_are_refused(
    tmp_path: Path, files: dict[str, bytes], expected: str
) -> None:
    (tmp_path / "secret.arrow").write_bytes(b"not for the tenant")
    folder = tmp_path / "store" / "t" / "ds"
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    with pytest.raises(DataError) as raised:
        read_records(str(folder))
    assert expected in str(raised.value)
    assert "save_to_disk" in raised.value.fix or "split" in raised.value.fix


def test_chat_record_errors_name_the_row_and_the_value(tmp_path: Path) -> None:
    bad = [CHATS[0], {"messages": [{"role": "robot", "content": "beep"}]}]
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(DataError, match=r"chat.json, row 2: messages\[0\].role is 'robot'") as raised:
        read_examples(str(path))
    assert "assistant" in raised.value.fix


# -- the same through S3 (moto), confined to the tenant's prefix ---------------------------
def test_s3_folder_and_parquet_read_through_the_store(
    tmp_path: Path, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    use_fake_aws_env(monkeypatch, moto_endpoint)
    bucket = create_bucket(moto_endpoint)
    client = admin_client(moto_endpoint)
    _write(tmp_path, "folder", CHATS)
    _write(tmp_path, "data.parquet", RECORDS)
    for path in [*(tmp_path / "folder").iterdir(), tmp_path / "data.parquet"]:
        key = f"tenants/a/{'chat/' if path.parent.name == 'folder' else ''}{path.name}"
        client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
    client.put_object(Bucket=bucket, Key="tenants/b/x.arrow", Body=b"tenant b's")
    assert read_examples(f"s3://{bucket}/tenants/a/chat")[0].messages == (("user", "Hi?"), ("assistant", "Hello."))
    assert read_records(f"s3://{bucket}/tenants/a/data.parquet") == RECORDS
    client.put_object(
        Bucket=bucket, Key="tenants/a/evil/state.json",
        Body=b'{"_data_files": [{"filename": "../../b/x.arrow"}]}',
    )
    with pytest.raises(DataError, match=r"\.\./\.\./b/x\.arrow"):
        read_records(f"s3://{bucket}/tenants/a/evil")


def test_rows_over_the_record_bound_are_skipped_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    long = {"instruction": "x" * 5000, "input": "", "output": "ok"}
    path = _write(tmp_path, "data.parquet", [RECORDS[0], long, RECORDS[2]])
    limits = LimitsConfig(max_record_bytes=4096)
    with caplog.at_level(logging.WARNING):
        numbered = read_numbered_examples(str(path), limits=limits)
    assert [n for n, _ in numbered] == [1, 3]
    assert "data.parquet, row 2: record of" in caplog.text and "max_record_bytes=4096" in caplog.text
