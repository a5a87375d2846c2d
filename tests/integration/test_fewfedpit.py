"""Whole FewFedPIT runs on the in-process engine (paper 004, Algorithm 1).

Checked as a tenant afraid of leakage would: at beta = 1 the upload is FedAvg's bit for bit;
at beta < 1 no tensor of the private adapter W^l reaches the exchange store, and the
synthetic data exists only in the tenant's own store. A tenant with too few records is
skipped with a reason in the summary, or fails its step, as configured.

M^g's generations come from a scripted generator here (a tiny random model writes nothing
that passes the filters, which the first test shows); IFS scoring, both trainings and the
mixing run on the real model.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from fedtune.algorithms.fewfedpit import synthesis
from fedtune.config import parse_job
from fedtune.core.errors import ConfigError, QuorumError
from fedtune.core.messages import ClientState, Update
from fedtune.engines import layout
from fedtune.engines.local import RunOptions, run_job
from fedtune.storage.uri import open_store
from fedtune.tracking.base import NullTracker
from tests.integration.conftest import tiny_job_dict

pytestmark = pytest.mark.slow

FEWFEDPIT = {"name": "fewfedpit", "candidates": 4, "keep": 2, "max_new_tokens": 8}
VERBS = ["Describe", "Explain", "Summarize", "Compare", "List", "Name", "Rate", "Sketch"]
NOUNS = ["color", "shape", "taste", "history", "price", "weight", "sound", "origin"]
ADJECTIVES = ["ripe", "small", "ancient", "bright", "frozen", "noisy", "tiny", "wooden"]
THINGS = ["bananas", "clouds", "castles", "stars", "lakes", "trains", "seeds", "boats"]


class ScriptedGenerator:
    """Distinct, well-formed instructions and answers (pairwise Rouge-L 1/3)."""

    def __init__(self, *_: Any) -> None:
        self.count = 0

    def __call__(self, batch: list[str]) -> list[str]:
        out = []
        for prompt in batch:
            i = self.count % len(VERBS)
            j = (self.count // len(VERBS)) % len(VERBS)
            self.count += 1
            if prompt.rstrip().endswith(":") and "\nTask " in prompt:
                out.append(f" {VERBS[i]} the {NOUNS[j]} of {ADJECTIVES[i]} {THINGS[j]}.")
            else:
                out.append(f" <noinput>\nOutput: {ADJECTIVES[j]} {THINGS[i]} answer {self.count}")
        return out


def _run(root: Path, algorithm: dict[str, Any], **overrides: Any) -> Any:
    job = parse_job(tiny_job_dict(root, name="ffp", algorithm=algorithm, rounds=1, **overrides))
    run_job(job, NullTracker(), RunOptions(progress=False))
    return job


def _updates(job: Any) -> dict[str, Update]:
    exchange = layout.JobStores(job)
    return {
        t.name: Update.load(exchange.exchange(t.name), layout.update_key(1)) for t in job.tenants
    }


def _digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.contiguous().numpy().tobytes()).hexdigest()


def test_beta_one_uploads_exactly_what_fedavg_uploads(tmp_path: Path) -> None:
    fedavg = _updates(_run(tmp_path / "fedavg", {"name": "fedavg"}))
    job = _run(tmp_path / "ffp", {**FEWFEDPIT, "beta": 1.0})
    ours = _updates(job)
    for tenant, update in fedavg.items():
        assert update.tensors.keys() == ours[tenant].tensors.keys()
        for name, tensor in update.tensors.items():
            assert torch.equal(tensor, ours[tenant].tensors[name]), (tenant, name)
        assert ours[tenant].meta["num_samples"] == update.meta["num_samples"]


def test_a_random_tiny_model_generates_nothing_usable_and_wg_stays_global(tmp_path: Path) -> None:
    job = _run(tmp_path, {**FEWFEDPIT, "beta": 0.5})
    summary = json.loads(
        open_store(str(tmp_path / "provider")).child("jobs/ffp").get_bytes(layout.summary_key(1))
    )
    tenant = summary["tenants"]["tenant-a"]
    assert tenant["metrics"]["fewfedpit/candidates"] == 0
    assert tenant["metrics"]["fewfedpit/instruction_prompts"] == 3 * FEWFEDPIT["candidates"]
    assert tenant["notes"] == ["no synthetic candidate passed the filters; W^g stays the global adapter"]
    assert job.algorithm.beta == 0.5


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(synthesis, "greedy", ScriptedGenerator)


def test_private_adapter_and_synthetic_data_never_leave_the_tenant(
    tmp_path: Path, scripted: None
) -> None:
    job = _run(tmp_path, {**FEWFEDPIT, "beta": 0.5})
    stores = layout.JobStores(job)
    exchange_root = stores.exchange_root()
    uploaded: set[str] = set()
    for key in exchange_root.list():
        if key.endswith(".safetensors"):
            uploaded |= {_digest(t) for t in exchange_root.get_tensors(key).values()}
        assert not key.endswith(".jsonl"), key
    provider = stores.provider()
    assert not [k for k in provider.list() if "synthetic" in k]
    for tenant in job.tenants:
        own = stores.tenant(tenant)
        state = ClientState.load(own, layout.client_state_key(1))
        private = state.group("private")
        assert private, "W^l is kept in the tenant's client state"
        assert not {_digest(t) for t in private.values()} & uploaded
        update = Update.load(stores.exchange(tenant.name), layout.update_key(1)).group("adapter")
        # The upload is a true mix: neither W^l nor the broadcast W^g.
        assert any(not torch.equal(update[n], private[n]) for n in private)
        synthetic = own.get_bytes(state.meta["synthetic"]).decode().splitlines()
        records = [json.loads(line) for line in synthetic]
        assert len(records) == FEWFEDPIT["keep"] == state.meta["synthetic_examples"]
        assert {"instruction", "input", "output", "ifs", "round"} <= records[0].keys()
        # What the provider learns of it: counts only.
        summary = json.loads(provider.get_bytes(layout.summary_key(1)))
        metrics = summary["tenants"][tenant.name]["metrics"]
        assert metrics["fewfedpit/kept"] == FEWFEDPIT["keep"]
        assert records[0]["instruction"] not in json.dumps(summary)


def _few_records(tmp_path: Path) -> Path:
    source = Path(tiny_job_dict(tmp_path)["tenants"][0]["data_uri"])
    path = tmp_path / "three.jsonl"
    path.write_text("".join(source.read_text().splitlines(keepends=True)[:3]))
    return path


def test_too_few_records_is_skipped_with_a_reason(tmp_path: Path, scripted: None) -> None:
    few = _few_records(tmp_path)
    tenants = [{"name": "tenant-a", "data_uri": str(few)}]
    _run(tmp_path / "w", FEWFEDPIT, tenants=tenants, min_clients=1)
    provider = open_store(str(tmp_path / "w" / "provider")).child("jobs/ffp")
    summary = json.loads(provider.get_bytes(layout.summary_key(1)))
    notes = summary["tenants"]["tenant-a"]["notes"]
    # The provider's sentence for the tenant's code: not the tenant's text (its record count).
    assert notes == [
        "synthetic data skipped: fewer local training records than instruction_demos "
        "(too_few_records: local-only)"
    ]


def test_too_few_records_refused_by_config_fails_the_tenant_step(tmp_path: Path) -> None:
    few = _few_records(tmp_path)
    tenants = [{"name": "tenant-a", "data_uri": str(few)}]
    with pytest.raises(QuorumError):
        _run(tmp_path / "w", {**FEWFEDPIT, "too_few_records": "refuse"}, tenants=tenants, min_clients=1)
    details = (tmp_path / "w" / "tenants" / "tenant-a" / "jobs" / "ffp" / "errors").glob("*.txt")
    text = "\n".join(p.read_text() for p in details)
    assert "fewer than instruction_demos=8" in text and "too_few_records: local-only" in text


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"beta": 1.5}, "beta"),
        ({"beta": float("nan")}, "beta"),
        ({"keep": 40}, "keep=40 is larger than candidates=32"),
    ],
)
def test_bad_fewfedpit_settings_are_config_errors(
    tmp_path: Path, override: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_job(tiny_job_dict(tmp_path, algorithm={"name": "fewfedpit", **override}))
