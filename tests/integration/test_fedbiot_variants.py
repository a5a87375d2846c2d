"""FedBiOT variants and baselines on the in-process engine: sampling with bf16 deltas, FedOT,
Offsite-tuning, LoRA adapters on GPT-2, the example job, and bad input."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from fedtune.config import JobConfig, load_job
from fedtune.core.errors import ConfigError
from fedtune.core.messages import Broadcast, ClientState, ServerState
from fedtune.engines import layout
from fedtune.engines.local import RunOptions, run_job
from fedtune.models.layers import unique_state
from fedtune.tracking.base import NullTracker
from fedtune.training.context import ProviderContext
from tests.integration.conftest import DATA

QUIET = RunOptions(progress=False)
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fedbiot.yaml"


def _model(arch: str = "llama", num_layers: int = 6) -> dict[str, Any]:
    return {
        "source": "tiny", "arch": arch, "hidden_size": 32, "num_layers": num_layers,
        "num_heads": 2, "intermediate_size": 64, "max_position_embeddings": 256,
    }


def _fedbiot(**fields: Any) -> dict[str, Any]:
    base = {"name": "fedbiot", "adapter_size": 2, "dropout": 0.5, "pre_distill_steps": 2,
            "align_steps": 2, "align_lr": 0.005, "eval_every": 100}
    return {**base, **fields}


def _job(make_job: Callable[..., JobConfig], algorithm: dict[str, Any], **overrides: Any) -> JobConfig:
    fields: dict[str, Any] = {
        "model": _model(), "public_data_uri": str(DATA / "public.jsonl"), "algorithm": algorithm,
    }
    fields.update(overrides)
    return make_job(**fields)


def test_sampled_tenants_hold_exactly_the_providers_view_with_bf16_deltas(
    make_job: Callable[..., JobConfig],
) -> None:
    job = _job(
        make_job, _fedbiot(delta_dtype="bfloat16"), rounds=3, clients_per_round=2, min_clients=1,
        storage={"state_retention": 4},  # every round's state and broadcast are compared
    )
    summary = run_job(job, NullTracker(), QUIET)
    exchange = layout.JobStores(job).provider()
    last_seen: dict[str, int] = {}
    checked: set[str] = set()
    for record in summary["rounds"]:
        r = record["round"]
        broadcast = Broadcast.load(exchange, layout.broadcast_key(r))
        assert all(t.dtype == torch.bfloat16 for t in broadcast.group("delta").values())
        view = ServerState.load(exchange, layout.state_key(r)).group("view")
        for tenant in record["sampled"]:
            tenant_exchange = layout.JobStores(job).exchange(tenant)
            update = tenant_exchange.get_json(f"{layout.update_key(r)}.json")
            # A tenant that took part in the previous round applies the delta, others the full copy.
            expected = "delta" if last_seen.get(tenant) == r - 1 else "full"
            assert update["package_received"] == expected, (r, tenant)
            own = layout.JobStores(job).tenant(next(t for t in job.tenants if t.name == tenant))
            # The engine prunes kept states a re-run can no longer need; the newest remain.
            if ClientState.stored(own, layout.client_state_key(r)):
                package = ClientState.load(own, layout.client_state_key(r)).group("package")
                for name, tensor in view.items():
                    assert torch.equal(package[name], tensor), (r, tenant, name)
                checked.add(tenant)
            last_seen[tenant] = r
    assert checked == set(last_seen)  # every tenant's newest kept copy was compared
    assert any(t["metrics"]["bytes_down"] < 0.5 * summary["rounds"][0]["tenants"][s]["metrics"]["bytes_down"]
               for rec in summary["rounds"][1:] for s, t in rec["tenants"].items()
               if s in summary["rounds"][0]["tenants"])


def test_fedot_distils_once_and_then_sends_only_the_adapter(make_job: Callable[..., JobConfig]) -> None:
    job = _job(
        make_job, {"name": "fedot", "dropout": 0.5, "pre_distill_steps": 2, "eval_every": 100},
        storage={"state_retention": 3},  # states 0 and 2 are compared
    )
    summary = run_job(job, NullTracker(), QUIET)
    assert summary["adapter_layers"] == [0, 1, 4, 5]  # first 2 + last 2
    assert summary["emulator_layers"] == [2]  # floor(0.5 * 2) of the middle layers 2, 3
    second = summary["rounds"][1]
    for tenant in second["tenants"].values():
        assert tenant["metrics"]["bytes_down"] == tenant["metrics"]["bytes_up"]  # no emulator delta
    exchange = layout.JobStores(job).provider()
    first, last = (ServerState.load(exchange, layout.state_key(r)).group("emulator") for r in (0, 2))
    assert all(torch.equal(first[k], last[k]) for k in first)  # never realigned


def test_offsite_tuning_is_single_client(make_job: Callable[..., JobConfig]) -> None:
    job = _job(make_job, {"name": "offsite-tuning", "pre_distill_steps": 1})
    with pytest.raises(ConfigError, match="single-client, but the job has 3 tenants"):
        run_job(job, NullTracker(), QUIET)


def test_lora_adapter_on_gpt2_changes_only_adapter_layers(make_job: Callable[..., JobConfig]) -> None:
    job = _job(
        make_job, _fedbiot(adapter_training="lora", adapter_size=1), model=_model("gpt2", 4), rounds=1,
    )
    summary = run_job(job, NullTracker(), QUIET)
    assert summary["adapter_layers"] == [3] and summary["emulator_layers"] == [0]  # floor(0.5 * 3)
    update_names = set(
        ServerState.load(layout.JobStores(job).provider(), layout.state_key(1)).group("adapter")
    )
    assert update_names and all("lora_" in n for n in update_names)
    from transformers import AutoModelForCausalLM

    adapfu = unique_state(AutoModelForCausalLM.from_pretrained(summary["artifacts"]["adapfu"]["local_path"]))
    base = unique_state(ProviderContext.from_job(job).base_model())
    changed = {n for n in base if not torch.equal(base[n], adapfu[n])}
    assert changed and all(n.startswith("transformer.h.3.") for n in changed)


def test_bad_input_is_a_clear_error_naming_the_field(make_job: Callable[..., JobConfig]) -> None:
    with pytest.raises(ConfigError, match="public_data_uri is not set"):
        run_job(_job(make_job, _fedbiot(), public_data_uri=None), NullTracker(), QUIET)
    with pytest.raises(ConfigError, match="public_data_uri=.*nowhere.jsonl"):
        run_job(_job(make_job, _fedbiot(), public_data_uri=str(DATA / "nowhere.jsonl")), NullTracker(), QUIET)
    with pytest.raises(ConfigError, match="algorithm.adapter_size=6"):
        run_job(_job(make_job, _fedbiot(adapter_size=6)), NullTracker(), QUIET)
    with pytest.raises(ConfigError, match=r"algorithm\.fedbiot\.dropout: Input should be less than 1"):
        _job(make_job, _fedbiot(dropout=1.0))


def test_example_job_is_valid_and_non_iid() -> None:
    job = load_job(EXAMPLE)
    assert job.algorithm.name == "fedbiot"
    assert job.model.source == "tiny" and job.model.num_layers >= 8  # type: ignore[union-attr]
    assert len(job.tenants) == 3 and job.public_data_uri is not None
    assert Path(job.public_data_uri).is_file()
    categories = [
        {line.split('"category": "')[1].split('"')[0] for line in Path(t.data_uri).read_text().splitlines()}
        for t in job.tenants
    ]
    assert all(len(c) == 2 for c in categories) and len(set().union(*categories)) > 2


def test_stopped_and_resumed_run_ends_bitwise_equal(make_job: Callable[..., JobConfig]) -> None:
    algorithm = _fedbiot(delta_dtype="bfloat16")
    straight = _job(make_job, algorithm, rounds=2)
    run_job(straight, NullTracker(), QUIET)
    chained = _job(make_job, algorithm, rounds=2)
    run_job(chained, NullTracker(), RunOptions(progress=False, until_round=1))
    run_job(chained, NullTracker(), RunOptions(progress=False, resume=True))
    a, b = (ServerState.load(layout.JobStores(j).provider(), layout.state_key(2)) for j in (straight, chained))
    assert a.tensors.keys() == b.tensors.keys() and a.meta["holders"] == b.meta["holders"]
    assert all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)
