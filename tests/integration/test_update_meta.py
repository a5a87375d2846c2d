"""What tenants send is typed: numbers under declared keys, codes instead of text.

A tenant's update metadata ends in the provider's round records, run summary and MLflow.
An update whose metadata carries free text, an undeclared metric or a value that is not a
finite number is rejected by the provider (naming the tenant, never quoting the text), the
round goes on with the other tenants, and the text is nowhere the provider keeps.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest

from fedtune.config import parse_job
from fedtune.core.errors import DataError, UpdateRejected
from fedtune.core.messages import Update
from fedtune.core.update_meta import (
    EVAL_KEYS,
    METRIC_KEYS,
    TENANT_FLAGS,
    check_eval_metrics,
    check_update_meta,
)
from fedtune.engines import layout, steps
from fedtune.engines.summary import RoundRecord
from tests.integration.conftest import tiny_job_dict

GOOD = {"num_samples": 12, "train_loss": 1.5, "eval_loss": None, "steps": 2, "tokens": 300,
        "train_seconds": 0.2, "eval_seconds": 0.1, "metrics": {"bytes_up": 10.0}}


@pytest.mark.parametrize(
    ("meta", "what"),
    [
        pytest.param({**GOOD, "notes": ["SECRET free text"]}, r"\['\(unknown key\)'\]", id="free-text-notes"),
        pytest.param({**GOOD, "metrics": {"SECRET/key": 1.0}}, "1 metric key", id="undeclared-metric"),
        pytest.param({**GOOD, "metrics": {"bytes_up": "SECRET"}}, r"\['metrics'\]", id="text-metric"),
        pytest.param({**GOOD, "metrics": {"bytes_up": True}}, r"\['metrics'\]", id="bool-metric"),
        pytest.param({**GOOD, "train_loss": float("nan")}, r"\['train_loss'\]", id="nan-loss"),
        pytest.param({**GOOD, "eval_loss": float("inf")}, r"\['eval_loss'\]", id="inf-loss"),
        pytest.param({**GOOD, "flags": ["SECRET reason"]}, r"\['flags'\]", id="undeclared-flag"),
        pytest.param({**GOOD, "metrics": {f"m{i}": 1.0 for i in range(200)}}, r"\['metrics'\]",
                     id="unbounded-metrics"),
        pytest.param({**GOOD, "secagg": {"weight": 1.0, "unopened": {"t": "SECRET"}, "plain_bytes": 1}},
                     r"\['secagg'\]", id="text-in-secagg"),
    ],
)
def test_metadata_outside_the_schema_is_rejected_naming_the_tenant(meta: dict[str, Any], what: str) -> None:
    with pytest.raises(UpdateRejected, match=rf"tenant 'tenant-b': update rejected: .*{what}") as info:
        check_update_meta("tenant-b", meta)
    assert "SECRET" not in str(info.value) and "SECRET" not in info.value.fix


def test_every_declared_metric_and_flag_is_accepted() -> None:
    meta = {**GOOD, "metrics": {k: 1.0 for k in METRIC_KEYS}, "flags": list(TENANT_FLAGS)}
    parsed = check_update_meta("tenant-a", meta)
    assert parsed.notes() == list(TENANT_FLAGS.values())


def _round_with(tmp_path: Path, tamper: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """One real FedAvg round whose tenant-b update metadata is replaced by ``tamper``."""
    job = parse_job(tiny_job_dict(tmp_path / "w", rounds=1, min_clients=2))
    provider = steps.ProviderEnv.create(job)
    steps.init_step(provider)
    steps.configure_step(provider, 1)
    clients = {n: steps.client_step(steps.TenantEnv.create(job, n), 1) for n in steps.sample_clients(job, 1)}
    exchange = layout.JobStores(job).exchange("tenant-b")
    stored = Update.load(exchange, layout.update_key(1))
    Update(tensors=stored.tensors, meta={**stored.meta, **tamper}).save(exchange, layout.update_key(1))
    clients["tenant-b"]["meta"] = {**clients["tenant-b"]["meta"], **tamper}
    aggregate = steps.aggregate_step(provider, 1, sorted(clients))
    record = RoundRecord.build(1, sorted(clients), {}, clients, aggregate, 1.0)
    return provider, record.to_json()


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param({"notes": ["{marker}"]}, id="notes"),
        pytest.param({"metrics": {"{marker}": 1.0}}, id="metric-key"),
        pytest.param({"metrics": {"bytes_up": "{marker}"}}, id="metric-value"),
    ],
)
def test_a_tampered_update_is_rejected_and_its_text_reaches_no_record(
    tmp_path: Path, tamper: dict[str, Any]
) -> None:
    marker = uuid.uuid4().hex
    tamper = json.loads(json.dumps(tamper).replace("{marker}", marker))
    provider, record = _round_with(tmp_path, tamper)
    # The round went on with the other tenants; tenant-b's update was rejected, by name.
    assert record["accepted"] == ["tenant-a", "tenant-c"]
    assert "tenant 'tenant-b': update rejected" in record["rejected"]["tenant-b"]
    assert record["tenants"]["tenant-b"]["metrics"] == {} and "notes" not in record["tenants"]["tenant-b"]
    assert marker not in json.dumps(record)
    # Nothing the provider stored quotes it either (its state, its records).
    provider_files = [p for p in Path(provider.store().uri.removeprefix("file://")).rglob("*") if p.is_file()]
    assert provider_files and not any(marker.encode() in p.read_bytes() for p in provider_files)


def test_a_tenant_flag_shows_as_the_providers_sentence(tmp_path: Path) -> None:
    _, record = _round_with(tmp_path, {"flags": ["fewfedpit/no-candidate"]})
    assert record["accepted"] == ["tenant-a", "tenant-b", "tenant-c"]
    assert record["tenants"]["tenant-b"]["notes"] == [TENANT_FLAGS["fewfedpit/no-candidate"]]


def test_a_tenant_store_failure_keeps_its_text_with_the_tenant(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tenant's store is down: the full error (which quotes the record) is logged nowhere;
    it goes to a file only the tenant's process user reads, and the provider sees its kind
    and line."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tenant-tmp"))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    blocker = tmp_path / "blocked"
    blocker.write_text("a file where the tenant's store folder should be")
    raw = tiny_job_dict(tmp_path / "w", rounds=1)
    raw["tenants"][1]["store_uri"] = str(blocker / "store")  # every write fails
    job = parse_job(raw)
    env = steps.TenantEnv.create(job, "tenant-b")
    marker = uuid.uuid4().hex
    error = DataError(f"record 3 quotes {marker}", record=3)
    with caplog.at_level(logging.DEBUG):
        where = steps.keep_failure_details(env, "round-000001", error)
    assert marker not in caplog.text
    assert "local file" in where and marker not in where
    path = Path(where.split("local file ", 1)[1].split(" ", 1)[0])
    assert marker in path.read_text("utf-8") and (path.stat().st_mode & 0o077) == 0
    shown = error.redacted().render()  # what the provider gets: the kind and the line
    assert shown.startswith("DataError at line 3: ") and marker not in shown


@pytest.mark.parametrize(
    "metrics",
    [
        pytest.param({"SECRET key": 1.0}, id="undeclared-key"),
        pytest.param({"eval_loss": "SECRET"}, id="text"),
        pytest.param({"eval_loss": float("nan")}, id="nan"),
        pytest.param(["SECRET"], id="not-a-map"),
    ],
)
def test_a_final_evaluation_outside_the_schema_is_rejected_naming_the_tenant(metrics: Any) -> None:
    with pytest.raises(UpdateRejected, match="tenant 'tenant-b': final evaluation rejected") as info:
        check_eval_metrics("tenant-b", metrics)
    assert "SECRET" not in str(info.value)
    assert check_eval_metrics("tenant-b", {k: 1 for k in EVAL_KEYS}) == {k: 1.0 for k in EVAL_KEYS}


def test_under_secure_aggregation_an_update_with_text_counts_as_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A masked update cannot leave the sum once unmasking began: the provider checks its
    metadata before asking for unmasking, and one that does not fit is unmasked as a dropout."""
    from fedtune.algorithms.fedavg import FedAvg
    from fedtune.engines.local import RunOptions, run_job
    from fedtune.tracking.base import NullTracker

    marker = uuid.uuid4().hex
    original = FedAvg.client_step

    def chatty(self, ctx, broadcast, data, client_state):  # type: ignore[no-untyped-def]
        update, state = original(self, ctx, broadcast, data, client_state)
        if data.tenant == "tenant-b":
            update.meta["notes"] = [f"tenant-b says {marker}"]
        return update, state

    monkeypatch.setattr(FedAvg, "client_step", chatty)
    job = parse_job(tiny_job_dict(tmp_path / "w", rounds=1, min_clients=2,
                                  algorithm={"name": "fedavg", "aggregation_weights": "uniform"},
                                  secure_aggregation={"enabled": True}))
    summary = run_job(job, NullTracker(), RunOptions(progress=False))
    record = summary["rounds"][0]
    assert record["accepted"] == ["tenant-a", "tenant-c"]
    assert "tenant 'tenant-b': update rejected" in record["rejected"]["tenant-b"]
    assert marker not in json.dumps(summary)
    provider_files = [p for p in (tmp_path / "w" / "provider").rglob("*") if p.is_file()]
    assert provider_files and not any(marker.encode() in p.read_bytes() for p in provider_files)
