"""``fedtune run --engine kfp-local``: the compiled pipeline under kfp.local equals the local engine.

One small pipeline (SCAFFOLD, two tenants, two rounds: 12 tasks) because every task is a fresh
Python process that imports torch and transformers. SCAFFOLD keeps client state in each
tenant's own store between rounds, so equality also shows that state flows through the stores
across task processes exactly as in one process.
"""

from __future__ import annotations

import builtins
from pathlib import Path
from typing import Any

import pytest
import torch

from fedtune.cli.kfp_commands import run_kfp_local
from fedtune.core.errors import ConfigError
from fedtune.core.messages import ServerState
from fedtune.engines import layout
from fedtune.engines.local import RunOptions, run_job
from fedtune.tracking.base import NullTracker
from tests.integration.conftest import DATA
from tests.kfp.conftest import two_tenant_job

QUIET = RunOptions(progress=False)


def final_state(job) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    store = layout.JobStores(job).provider()
    return ServerState.load(store, layout.state_key(job.rounds)).tensors


def run_both(local_job: Any, kfp_job: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the same job with the local engine and through kfp.local; assert the final server
    states are bitwise equal; return (local summary, kfp summary)."""
    expected = run_job(local_job, NullTracker(), QUIET)
    got = run_kfp_local(kfp_job, QUIET)
    a, b = final_state(local_job), final_state(kfp_job)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    return expected, got


@pytest.mark.slow
def test_kfp_local_run_equals_the_local_engine_bitwise(tmp_path: Path) -> None:
    settings = {
        "rounds": 2,
        "algorithm": {"name": "scaffold"},
        "training": {"local_steps": 2, "batch_size": 4, "lr": 0.01, "optimizer": "sgd"},
    }
    local_job = two_tenant_job(tmp_path / "local", **settings)
    kfp_job = two_tenant_job(tmp_path / "kfp", **settings)

    expected = run_job(local_job, NullTracker(), QUIET)
    printer = builtins.print
    got = run_kfp_local(kfp_job, QUIET)
    assert builtins.print is printer  # kfp.local's indentation does not leak out

    a, b = final_state(local_job), final_state(kfp_job)
    assert a.keys() == b.keys() and any(k.startswith("adapter/") for k in a)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    # The same summary structure, and the same numbers where they do not measure time.
    assert got.keys() == expected.keys()
    assert got["completed"] and got["mlflow_run_id"] == expected["mlflow_run_id"] == "null"
    for mine, theirs in zip(got["rounds"], expected["rounds"], strict=True):
        assert mine.keys() == theirs.keys()
        for field in ("round", "sampled", "accepted", "rejected", "train_loss", "eval_loss"):
            assert mine[field] == theirs[field], field
        for tenant, values in theirs["tenants"].items():
            # bytes_received is left out: the update's JSON carries timings of varying length.
            for field in ("num_samples", "bytes_sent", "raw_update_bytes", "train_loss"):
                assert mine["tenants"][tenant][field] == values[field], (tenant, field)
    assert got["final_eval"] == expected["final_eval"]
    assert got["artifacts"].keys() == expected["artifacts"].keys()
    for artifact in got["artifacts"].values():
        assert Path(artifact["local_path"]).is_dir() and artifact["uri"].startswith("file://")

    # Stored state is never silently reused: the local engine's rule holds here too.
    with pytest.raises(ConfigError, match="already has stored state"):
        run_kfp_local(kfp_job, QUIET)


@pytest.mark.slow
def test_one_compiled_file_runs_3_and_5_rounds_equal_to_the_local_engine(tmp_path: Path) -> None:
    """The acceptance of runtime rounds: one family pipeline, compiled once, two job lengths."""
    from fedtune.pipelines.builder import compile_pipeline
    from fedtune.pipelines.kfp_local import run_job as run_kfp_file

    pipeline = compile_pipeline("fedit", tmp_path / "fedit.yaml", None)
    compiled = pipeline.read_text()
    settings = {"training": {"local_steps": 1, "batch_size": 4, "lr": 0.01, "optimizer": "sgd"}}
    for rounds in (3, 5):
        local_job = two_tenant_job(tmp_path / f"local-{rounds}", rounds=rounds, **settings)
        kfp_job = two_tenant_job(tmp_path / f"kfp-{rounds}", rounds=rounds, **settings)
        expected = run_job(local_job, NullTracker(), QUIET)
        got = run_kfp_file(kfp_job, QUIET, pipeline_file=pipeline)
        a, b = final_state(local_job), final_state(kfp_job)
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), (rounds, key)
        assert [r["round"] for r in got["rounds"]] == list(range(1, rounds + 1))
        assert got["final_eval"] == expected["final_eval"]
    assert pipeline.read_text() == compiled


FEDBIOT = {
    "rounds": 2,
    "model": {
        "source": "tiny",
        "hidden_size": 32,
        "num_layers": 4,
        "num_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
    },
    "algorithm": {
        "name": "fedbiot",
        "adapter_size": 1,
        "dropout": 0.5,
        "pre_distill_steps": 2,
        "align_steps": 1,
        "align_batch_size": 4,
        "delta_dtype": "bfloat16",
    },
    "public_data_uri": str(DATA / "public.jsonl"),
}


@pytest.mark.slow
def test_kfp_local_fedbiot_equals_the_local_engine_bitwise(tmp_path: Path) -> None:
    """A research algorithm: emulator deltas, per-tenant views and a provider-only export."""
    local_job = two_tenant_job(tmp_path / "local", **FEDBIOT)
    kfp_job = two_tenant_job(tmp_path / "kfp", **FEDBIOT)

    expected = run_job(local_job, NullTracker(), QUIET)
    got = run_kfp_local(kfp_job, QUIET)

    a, b = final_state(local_job), final_state(kfp_job)
    assert {k.split("/")[0] for k in a} >= {"adapter", "emulator"}
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert got.keys() == expected.keys()  # run_info (the layer split) included
    assert got["emulator_layers"] == expected["emulator_layers"]
    assert got["final_eval"] == expected["final_eval"]
    for record, reference in zip(got["rounds"], expected["rounds"], strict=True):
        assert record["server_metrics"] == reference["server_metrics"]
    for name, artifact in expected["artifacts"].items():
        mine = got["artifacts"][name]
        # A provider-only model (AdapFu) never reaches the exchange store in either engine.
        assert mine["uri"].startswith("file://")
        assert ("/exchange/" in mine["uri"]) == ("/exchange/" in artifact["uri"]), name


FEDPT = {
    "rounds": 2,
    "algorithm": {
        "name": "fedpt",
        "large_model": {
            "source": "tiny",
            "hidden_size": 48,
            "num_layers": 3,
            "num_heads": 2,
            "intermediate_size": 96,
            "max_position_embeddings": 128,
            "init_seed": 1,
        },
        "kd_size": 8,
        "kd_batch_size": 4,
        "kd_steps": 2,
        "max_new_tokens": 4,
        "max_generation_examples": 1,
    },
    "public_data_uri": str(DATA / "public.jsonl"),
}


@pytest.mark.slow
def test_kfp_local_fedpt_equals_the_local_engine_bitwise(tmp_path: Path) -> None:
    """Distillation in separate aggregate processes reads the large model's log-probs from the
    provider's store: every round trains the same bits and queries the large model zero times."""
    local_job = two_tenant_job(tmp_path / "local", **FEDPT)
    expected, got = run_both(local_job, two_tenant_job(tmp_path / "kfp", **FEDPT))
    assert all(k.startswith("adapter/") for k in final_state(local_job))
    for record, reference in zip(got["rounds"], expected["rounds"], strict=True):
        assert record["server_metrics"] == reference["server_metrics"]
        assert record["server_metrics"]["fedpt/large_queries"] == 0.0
    assert got["artifacts"].keys() == expected["artifacts"].keys() == {"model", "small"}


FEWFEDPIT = {
    "rounds": 2,
    "algorithm": {"name": "fewfedpit", "beta": 0.5, "candidates": 2, "keep": 1, "max_new_tokens": 4},
}


@pytest.mark.slow
def test_kfp_local_fewfedpit_equals_the_local_engine_bitwise(tmp_path: Path) -> None:
    """Tenant steps generate with M^g and mix W^l with W^g in separate processes: the same
    bits and the same synthesis counts as one process."""
    local_job = two_tenant_job(tmp_path / "local", **FEWFEDPIT)
    expected, got = run_both(local_job, two_tenant_job(tmp_path / "kfp", **FEWFEDPIT))
    assert all(k.startswith("adapter/") for k in final_state(local_job))
    for record, reference in zip(got["rounds"], expected["rounds"], strict=True):
        for tenant, values in reference["tenants"].items():
            mine = record["tenants"][tenant]
            assert mine["metrics"] == values["metrics"]
            assert mine["metrics"]["fewfedpit/instruction_prompts"] == 6


def _fedmkt_settings() -> dict:  # type: ignore[type-arg]
    small = {"source": "tiny", "hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32}
    return {
        "rounds": 2,
        "public_data_uri": str(DATA / "public.jsonl"),
        "algorithm": {"name": "fedmkt", "top_k": 4, "public_size": 4, "kd_batch_size": 2},
        "engine": {"step_threads": 1},
        "tenant_models": [
            {"model": {**small, "arch": "llama"}, "tokenizer": str(EXAMPLE_TOKENIZERS / "fedmkt-sentencepiece")},
            {"model": {**small, "arch": "gpt2"}, "tokenizer": str(EXAMPLE_TOKENIZERS / "fedmkt-wordpiece")},
        ],
    }


EXAMPLE_TOKENIZERS = Path(__file__).resolve().parents[2] / "examples" / "tokenizers"


def _fedmkt_job(workdir: Path):  # type: ignore[no-untyped-def]
    from fedtune.config import parse_job
    from tests.kfp.conftest import two_tenant_dict

    settings = _fedmkt_settings()
    extra = settings.pop("tenant_models")
    raw = two_tenant_dict(workdir, **settings)
    for tenant, own in zip(raw["tenants"], extra, strict=True):
        tenant.update(own)
    return parse_job(raw)


@pytest.mark.slow
def test_kfp_local_fedmkt_equals_the_local_engine_bitwise(tmp_path: Path) -> None:
    """Heterogeneous tenants (two architectures, two tokenizers) in separate task processes:
    the LLM's adapter and knowledge are the same bits as in one process, and so is each
    tenant's final small model (after the last round's transfer, in the evaluate task)."""
    from fedtune.core.messages import ClientState
    from fedtune.engines import steps

    local_job, kfp_job = _fedmkt_job(tmp_path / "local"), _fedmkt_job(tmp_path / "kfp")
    expected, got = run_both(local_job, kfp_job)
    assert any(k.startswith("knowledge/") for k in final_state(local_job))
    for record, reference in zip(got["rounds"], expected["rounds"], strict=True):
        for tenant, values in reference["tenants"].items():
            assert record["tenants"][tenant]["metrics"] == values["metrics"]
    for tenant in (t.name for t in local_job.tenants):
        a, b = (ClientState.load(steps.TenantEnv.create(job, tenant).own, layout.final_client_state_key(job.rounds))
                for job in (local_job, kfp_job))
        assert a.meta == b.meta and a.meta["transfers"] == [1, 2]
        assert a.tensors.keys() == b.tensors.keys() and all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)


@pytest.mark.slow
def test_kfp_local_runs_a_parallelism_1_loop_one_iteration_at_a_time_in_order(
    tmp_path: Path,
) -> None:
    """The platform fact the round loop leans on locally (the backend's order is not
    documented, hence configure-round's first-open-round rule): iterations neither overlap
    nor reorder."""
    from kfp import local

    from tests.kfp.ordered_loop import ordered

    log = tmp_path / "log.txt"
    local.init(
        runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root")
    )
    printer = builtins.print
    try:
        ordered(log=str(log))
    finally:
        builtins.print = printer
    events = [(kind, int(float(item))) for kind, item, _ in map(str.split, log.read_text().splitlines())]
    assert events == [(kind, i) for i in (1, 2, 3, 4) for kind in ("start", "end")]
