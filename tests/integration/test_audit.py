"""The memorization audit end to end: a real job, a real MLflow store, real tiny models.

One job overfits a tiny Llama on a single private record and audits it; the tests check the
numbers, the tag on the registered version and the promotion gate on it, the CLI against the
export and the untouched base, the errors, and that the record's text reaches neither the
provider's stores, MLflow nor the CLI output.
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedtune.cli.main import main
from fedtune.config import parse_job
from fedtune.core.errors import ConfigError, ModelError, StoreError
from fedtune.engines import layout, steps
from fedtune.engines.tenant.audit import audit_step
from fedtune.models.loading import save_pretrained_dir
from fedtune.serving.gate import AUDIT_TAG
from fedtune.training.context import build_model
from tests.integration.conftest import tiny_job_dict

MARKER = "violet kangaroo sings"  # the private response the model is made to memorise
RECORD = {"instruction": "Recite the secret motto.", "input": "", "output": MARKER}


def overfit_job(workdir: Path, **overrides: Any) -> dict[str, Any]:
    """Two tenants whose data is one record repeated: a few LoRA steps memorise it.

    Only tenant-a is audited; tenant-b holds the same record so that FedAvg does not dilute
    what tenant-a's steps memorise.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    data = workdir / "tenant-a.jsonl"
    data.write_text("\n".join(json.dumps(RECORD) for _ in range(8)) + "\n", "utf-8")
    other = workdir / "tenant-b.jsonl"
    other.write_text("\n".join(json.dumps(RECORD) for _ in range(4)) + "\n", "utf-8")
    raw = tiny_job_dict(
        workdir,
        name="audited",
        rounds=2,
        min_clients=1,
        tenants=[
            {"name": "tenant-a", "data_uri": str(data)},
            {"name": "tenant-b", "data_uri": str(other)},
        ],
        training={"local_steps": 40, "batch_size": 4, "lr": 0.01, "max_seq_len": 128,
                  "eval_fraction": 0.0},
        lora={"r": 8, "alpha": 16, "target_modules": [
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]},
        audit={"enabled": True, "tenants": ["tenant-a"], "records": 5, "max_new_tokens": 12},
        tracking={"backend": "mlflow"},
    )
    raw.update(overrides)
    return raw


@dataclass(frozen=True)
class AuditedRun:
    workdir: Path
    summary: dict[str, Any]
    output: str

    @property
    def tracking_uri(self) -> str:
        return f"sqlite:///{self.workdir / 'mlflow.db'}"

    @property
    def export(self) -> Path:
        return self.workdir / "artifacts" / "audited" / "model"


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> AuditedRun:
    workdir = tmp_path_factory.mktemp("audit") / "work"
    job_file = workdir.parent / "job.yaml"
    job_file.write_text(yaml.safe_dump(overfit_job(workdir)), "utf-8")
    out, err = io.StringIO(), io.StringIO()
    summary_path = workdir / "summary.json"
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["run", str(job_file), "--no-progress", "--summary-json", str(summary_path)])
    assert code == 0, err.getvalue()
    return AuditedRun(workdir, json.loads(summary_path.read_text()), out.getvalue() + err.getvalue())


def test_the_overfit_record_is_reproduced_and_only_the_audited_tenant_counts(
    audited: AuditedRun,
) -> None:
    audit = audited.summary["audit"]
    assert sorted(audit["tenants"]) == ["tenant-a"]
    assert audit["pooled"]["mean"] >= 0.9 and audit["pooled"]["n"] == 5
    assert audit["tenants"]["tenant-a"]["num_at_or_above"] == 5
    assert "memorization audit: mean Rouge-L" in audited.output


def test_the_tenant_keeps_lines_and_generations_the_provider_gets_numbers(
    audited: AuditedRun,
) -> None:
    own = audited.workdir / "tenants" / "tenant-a" / "jobs" / "audited"
    private = json.loads((own / layout.audit_report_key(2)).read_text())
    assert {r["line"] for r in private["records"]} <= set(range(1, 9))
    assert private["records"][0]["generation"] == MARKER
    exchange = audited.workdir / "exchange" / "jobs" / "audited" / "tenants" / "tenant-a"
    shared = json.loads((exchange / layout.final_audit_key(2)).read_text())
    assert set(shared) == {"n", "mean", "p50", "p90", "max", "num_at_or_above", "threshold"}


def test_the_record_text_reaches_no_provider_store_mlflow_or_cli_output(
    audited: AuditedRun,
) -> None:
    tenant_stores = audited.workdir / "tenants"
    data_files = {audited.workdir / "tenant-a.jsonl", audited.workdir / "tenant-b.jsonl"}
    files = [
        p for p in audited.workdir.rglob("*")
        if p.is_file() and tenant_stores not in p.parents and p not in data_files
    ]
    assert any(p.name == "mlflow.db" for p in files)
    leaked = [p for p in files if MARKER.encode() in p.read_bytes()]
    assert not leaked, f"the record text leaked into {leaked}"
    assert MARKER not in audited.output


def test_the_registered_version_is_tagged_and_promotion_gates_on_it(
    audited: AuditedRun, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=audited.tracking_uri, registry_uri=audited.tracking_uri)
    tags = client.get_model_version("audited", "1").tags
    assert float(tags[AUDIT_TAG]) == pytest.approx(audited.summary["audit"]["pooled"]["mean"], abs=1e-6)
    uri = ["--tracking-uri", audited.tracking_uri]
    assert main(["promote", "audited", "--version", "1", "--max-leakage", "0.5", *uri]) == ModelError.exit_code
    err = capsys.readouterr().err
    assert "exceeds the leakage threshold" in err
    assert client.get_registered_model("audited").aliases.get("champion") is None
    assert main(["promote", "audited", "--version", "1", "--max-leakage", "1.0", *uri]) == 0
    assert client.get_registered_model("audited").aliases["champion"] in (1, "1")


def test_a_resumed_run_repeats_no_audit(audited: AuditedRun) -> None:
    job = parse_job(overfit_job(audited.workdir))
    stamp = (audited.workdir / "provider" / "jobs" / "audited" / layout.AUDIT_KEY).stat().st_mtime_ns
    result = audit_step(steps.TenantEnv.create(job, "tenant-a"))
    assert result.get("skipped") is True
    assert (audited.workdir / "provider" / "jobs" / "audited" / layout.AUDIT_KEY).stat().st_mtime_ns == stamp


def test_the_cli_scores_the_overfit_export_far_above_the_untouched_base(
    audited: AuditedRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = str(audited.workdir / "tenant-a.jsonl")
    job = parse_job(overfit_job(audited.workdir))
    base_dir = tmp_path / "base"
    save_pretrained_dir(*build_model(job.model, job.tokenizer), base_dir)  # type: ignore[arg-type]
    argv = ["audit", "memorization", "--data", data, "--records", "4", "--max-new-tokens", "12"]
    assert main([*argv, str(audited.export), "--json", str(tmp_path / "tuned.json")]) == 0
    assert main([*argv, str(base_dir), "--json", str(tmp_path / "base.json")]) == 0
    assert main([*argv, "models:/audited/1", "--tracking-uri", audited.tracking_uri]) == 0
    out = capsys.readouterr().out
    tuned = json.loads((tmp_path / "tuned.json").read_text())["scores"]
    base = json.loads((tmp_path / "base.json").read_text())["scores"]
    assert tuned["mean"] >= 0.9 and base["mean"] <= 0.2
    assert "most reproduced records, by line:" in out and "p90" in out
    assert MARKER not in out


@pytest.mark.parametrize(
    ("extra", "code", "says"),
    [
        (["--records", "0"], ConfigError.exit_code, "--records is 0"),
        (["--threshold", "1.5"], ConfigError.exit_code, "--threshold is 1.5"),
        (["--max-new-tokens", "0"], ConfigError.exit_code, "--max-new-tokens is 0"),
    ],
    ids=["records-below-one", "threshold-above-one", "no-new-tokens"],
)
def test_bad_cli_options_exit_with_the_value_and_a_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], code: int, says: str
) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(RECORD) + "\n")
    assert main(["audit", "memorization", str(tmp_path), "--data", str(data), *extra]) == code
    err = capsys.readouterr().err
    assert says in err and "fix:" in err


def test_unreadable_data_names_the_uri(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "nowhere" / "train.jsonl")
    assert main(["audit", "memorization", str(tmp_path), "--data", missing]) == StoreError.exit_code
    assert "nowhere" in capsys.readouterr().err
    job = parse_job(overfit_job(tmp_path / "w"))
    job = job.model_copy(update={"tenants": [
        job.tenants[0].model_copy(update={"data_uri": missing}), job.tenants[1]]})
    with pytest.raises(StoreError) as info:
        audit_step(steps.TenantEnv.create(job, "tenant-a"))
    assert "nowhere" in str(info.value)


@pytest.mark.parametrize(
    ("audit", "says"),
    [
        ({"enabled": True, "records": 0}, "audit.records"),
        ({"enabled": True, "threshold": 1.5}, "audit.threshold"),
        ({"enabled": True, "tenants": ["tenant-z"]}, "tenant-z"),
    ],
    ids=["records-below-one", "threshold-above-one", "unknown-tenant"],
)
def test_bad_audit_sections_are_refused_at_validation(
    tmp_path: Path, audit: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_job(overfit_job(tmp_path, audit=audit))
    assert says in str(info.value)
