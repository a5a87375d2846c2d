"""Redaction: a tenant's record text never reaches the provider, whatever fails.

A poisoned record carries a unique marker in a field whose bad value the (tenant-side) error
message quotes. After the failure the marker must appear nowhere the provider reads: its
store, the exchange, the MLflow store, the run summary, the CLI's output, the KFP markers.
The tenant's own store keeps the full error for the tenant.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedtune.cli.main import main
from fedtune.config import JobConfig, parse_job
from fedtune.core.errors import DataError
from fedtune.engines import layout, steps
from fedtune.entrypoints import aggregate, client_step, server_init
from tests.helpers.algorithms import job_overrides, one_per_family, tenant_fields
from tests.integration.conftest import DATA, tiny_job_dict
from tests.integration.test_boundary import CLIENT_CASES


def poisoned_data(folder: Path, marker: str) -> Path:
    """tenant-b's data with one record whose ``context`` is a list quoting the marker."""
    lines = (DATA / "tenant-b.jsonl").read_text("utf-8").splitlines()
    bad = {"instruction": "Say hello", "context": [f"secret {marker}"], "response": "hello", "category": "open_qa"}
    lines.insert(2, json.dumps(bad))
    path = folder / "tenant-b.jsonl"
    path.write_text("\n".join(lines) + "\n", "utf-8")
    return path


#: One algorithm of every pipeline family, whose tenant steps differ most: FedIT's, FedBiOT's
#: (an emulator), FedPT's (a provider-side large model), FedMKT's (tenants' own models, the
#: shared public set), FewFedPIT's (generation on the tenant's records).
ALGORITHMS = one_per_family()


def job_with_poison(
    tmp_path: Path, marker: str, algorithm: str = "fedavg", **overrides: Any
) -> dict[str, Any]:
    fields = {**job_overrides(algorithm), **overrides}
    fields.pop("tenants", None)  # its own tenants, as the tiny job's, with tenant_fields below
    raw = tiny_job_dict(tmp_path / "work", rounds=1, min_clients=2, **fields)
    raw["tenants"][1]["data_uri"] = str(poisoned_data(tmp_path, marker))
    raw["tracking"] = {"backend": "mlflow"}  # a real SQLite store in the workdir
    raw["algorithm"] = CLIENT_CASES[algorithm]
    for tenant in raw["tenants"]:
        tenant.update(tenant_fields(algorithm))
    return raw


def provider_side_files(workdir: Path, tenant_b_store: Path) -> list[Path]:
    """Everything under the workdir except tenant-b's own private store."""
    return [
        p
        for p in workdir.rglob("*")
        if p.is_file() and tenant_b_store not in p.parents
    ]


def assert_marker_absent(files: list[Path], marker: str) -> None:
    assert files, "nothing to search"
    leaked = [p for p in files if marker.encode() in p.read_bytes()]
    assert not leaked, f"the marker leaked into {leaked}"


def test_the_unredacted_error_does_quote_the_record(tmp_path: Path) -> None:
    """The control: without redaction the marker would be in the message."""
    marker = uuid.uuid4().hex
    job = parse_job(job_with_poison(tmp_path, marker))
    with pytest.raises(DataError) as info:
        steps.TenantEnv.create(job, "tenant-b").data()
    assert marker in str(info.value) and info.value.record == 3


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_poisoned_record_reaches_neither_stores_mlflow_nor_the_cli_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], algorithm: str
) -> None:
    marker = uuid.uuid4().hex
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job_with_poison(tmp_path, marker, algorithm)))
    code = main(["run", str(job_file), "--summary-json", str(tmp_path / "work" / "s.json")])
    out = capsys.readouterr()
    assert code == DataError.exit_code
    assert marker not in out.out and marker not in out.err
    assert "DataError at line 3" in out.err and "tenant tenant-b" in out.err
    workdir = tmp_path / "work"
    own = workdir / "tenants" / "tenant-b"
    # Preflight fails before the run stores anything of its own (no run.json, no MLflow
    # database): only the tenants' details files exist, and none outside tenant-b's store.
    assert provider_side_files(workdir, own) == []
    # The tenant keeps the full error, record text and fix included, in its own store.
    details = list(own.rglob("preflight.txt"))
    assert details and marker in details[0].read_text("utf-8")


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_failed_client_step_leaves_only_its_kind_and_line_in_the_round(
    tmp_path: Path, algorithm: str
) -> None:
    """The KFP path (no preflight): client-step marker, aggregate record, MLflow metrics."""
    marker = uuid.uuid4().hex
    job: JobConfig = parse_job(job_with_poison(tmp_path, marker, algorithm))
    provider = steps.ProviderEnv.create(job)
    server_init.run(job)  # as the pipeline starts: the initial state and the MLflow run
    steps.configure_step(provider, 1)
    markers = [client_step.run(job, 1, name) for name in ("tenant-a", "tenant-b", "tenant-c")]
    failed = next(m for m in markers if m["tenant"] == "tenant-b")
    assert not failed["ok"] and marker not in json.dumps(markers)
    assert "DataError at line 3" in failed["reason"]
    result = aggregate.run(job, 1, {}, markers)
    assert result["accepted"] == ["tenant-a", "tenant-c"]
    record = provider.store().get_json(layout.summary_key(1))
    assert "DataError at line 3" in record["rejected"]["tenant-b"]
    workdir = Path(job.workdir)
    assert_marker_absent(provider_side_files(workdir, workdir / "tenants" / "tenant-b"), marker)
