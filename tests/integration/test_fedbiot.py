"""A whole FedBiOT run on the in-process engine with a real MLflow store.

One run (module-scoped) is checked from every side: layer split in the summary and the MLflow
params, bytes per tenant and round, the provider's IP (hashes of every stored tensor), the two
exported models (reload, logits, which layers differ) and their registration.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from mlflow import MlflowClient
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from fedtune.algorithms.fedbiot import transport
from fedtune.algorithms.fedbiot.config import FedBiOTConfig
from fedtune.algorithms.fedbiot.server import Provider
from fedtune.config import JobConfig, parse_job
from fedtune.core.messages import ServerState
from fedtune.engines import layout
from fedtune.engines.local import RunOptions, run_job
from fedtune.models import build_tiny_model, load_tokenizer, save_pretrained_dir
from fedtune.models.layers import layer_extract, unique_state
from fedtune.tracking.mlflow_tracker import MlflowTracker, local_tracking_uri
from fedtune.training.context import ProviderContext
from tests.integration.conftest import DATA, tiny_job_dict

ALGORITHM = {
    "name": "fedbiot",
    "adapter_size": 2,
    "dropout": 0.5,
    "pre_distill_steps": 4,
    "align_steps": 2,
    "align_lr": 0.005,
    "eps": 1.0,
}


def provider_model_dir(path: Path, num_layers: int = 6) -> Path:
    """The provider's own model: a tiny Llama whose every tensor is distinct (norms included)."""
    tokenizer = load_tokenizer("builtin")
    model = build_tiny_model(
        "llama",
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_layers=num_layers,
        num_heads=2,
        intermediate_size=64,
        max_position_embeddings=256,
        seed=3,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.01 * torch.randn(param.shape, generator=generator))
    return save_pretrained_dir(model, tokenizer, path)


def _digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.contiguous().numpy().tobytes()).hexdigest()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("fedbiot")
    model_dir = provider_model_dir(root / "provider-model")
    job = parse_job(
        tiny_job_dict(
            root / "work",
            name="fb",
            model={"source": "pretrained", "uri": str(model_dir)},
            tokenizer="auto",
            algorithm=ALGORITHM,
            public_data_uri=str(DATA / "public.jsonl"),
            storage={"state_retention": 3},  # the encodings test reads every state
        )
    )
    tracking_uri = local_tracking_uri(root / "mlflow")
    tracker = MlflowTracker(tracking_uri, experiment="fedbiot-itest")
    summary = run_job(job, tracker, RunOptions(progress=False))
    return {"job": job, "summary": summary, "model_dir": model_dir, "tracking_uri": tracking_uri}


def _job(run: dict[str, Any]) -> JobConfig:
    return run["job"]  # type: ignore[no-any-return]


def test_summary_and_mlflow_params_record_the_layer_split(run: dict[str, Any]) -> None:
    summary = run["summary"]
    assert summary["completed"]
    assert summary["emulator_layers"] == [0, 3]  # floor(0.5 * 4) = 2 of E* = 0..3
    assert summary["adapter_layers"] == [4, 5]
    data = MlflowClient(run["tracking_uri"]).get_run(summary["mlflow_run_id"]).data
    assert data.params["run_info.emulator_layers"] == "[0, 3]"
    assert data.params["run_info.adapter_layers"] == "[4, 5]"
    # Per-round metrics: AdapEmu per tenant, AdapFu and alignment on the provider's side.
    for key in ("adapemu/eval_loss/tenant-a", "bytes_down/tenant-b", "server/adapfu/public_loss",
                "server/align/l2", "server/pre_distill/l2_after"):
        assert key in data.metrics, key


def test_bytes_down_are_adapter_plus_full_then_delta_and_bytes_up_the_adapter(
    run: dict[str, Any],
) -> None:
    first, second = run["summary"]["rounds"]
    adapter_bytes = None
    for tenant in first["tenants"].values():
        adapter_bytes = tenant["metrics"]["bytes_up"]
        assert tenant["metrics"]["bytes_down"] > 2 * adapter_bytes  # full package in round 1
    for tenant in second["tenants"].values():
        # Round 2: adapter + the emulator delta (2 layers, float32: the adapter's size).
        assert tenant["metrics"]["bytes_down"] == 2 * adapter_bytes
        assert tenant["metrics"]["bytes_up"] == adapter_bytes
        assert tenant["bytes_sent"] < first["tenants"]["tenant-a"]["bytes_sent"]
    assert "server/adapfu/public_loss" in {f"server/{k}" for k in second["server_metrics"]}
    assert all("adapemu/eval_loss" in t["metrics"] for t in second["tenants"].values())


def test_no_stored_tensor_is_a_dropped_layer_of_the_full_emulator(run: dict[str, Any]) -> None:
    base = AutoModelForCausalLM.from_pretrained(run["model_dir"])
    state = unique_state(base)
    split = layer_extract(6, 2, 0.5)
    dropped = {
        _digest(state[n]): n for n in state if n.startswith(tuple(f"model.layers.{i}." for i in split.dropped))
    }
    full_emulator = {_digest(state[n]) for n in state if n.startswith(
        tuple(f"model.layers.{i}." for i in split.full_emulator))}
    assert len(dropped) == sum(1 for n in state if n.startswith(("model.layers.1.", "model.layers.2.")))
    workdir = Path(_job(run).workdir)
    stored = {}
    for blob in workdir.rglob("*.safetensors"):
        if blob.relative_to(workdir).parts[0] in ("artifacts", "provider"):
            continue  # the provider's export folder and its private store: E* may live there
        for name, tensor in load_file(str(blob)).items():
            stored[_digest(tensor)] = f"{blob.relative_to(workdir)}:{name}"
    leaked = {dropped[h]: where for h, where in stored.items() if h in dropped}
    assert not leaked, leaked
    assert not full_emulator <= set(stored)
    exchange = workdir / "exchange"
    # Exports (AdapFu holds E*) stay in the provider-private store; none reach the exchange.
    assert not any({"adapfu", "adapemu"} & set(p.parts) for p in exchange.rglob("*"))
    assert any("adapfu" in p.parts for p in (workdir / "provider").rglob("*"))


def _final_provider(run: dict[str, Any]) -> tuple[Provider, ServerState]:
    job = _job(run)
    state = ServerState.load(layout.JobStores(job).provider(), layout.state_key(job.rounds))
    config = FedBiOTConfig.model_validate(ALGORITHM)
    provider = Provider.create(config, ProviderContext.from_job(job), layer_extract(6, 2, 0.5))
    return provider, state


def test_exported_models_reload_with_the_same_logits(run: dict[str, Any]) -> None:
    provider, state = _final_provider(run)
    ids = torch.randint(5, 200, (2, 9), generator=torch.Generator().manual_seed(0))
    artifacts = run["summary"]["artifacts"]
    expected = {
        "adapemu": provider.adapemu(state.group("emulator"), state.group("adapter")),
        "adapfu": provider.adapfu(state.group("adapter")),
    }
    for kind, model in expected.items():
        path = Path(artifacts[kind]["local_path"])
        reloaded = AutoModelForCausalLM.from_pretrained(path)
        with torch.no_grad():
            assert torch.equal(reloaded(input_ids=ids).logits, model(input_ids=ids).logits), kind
        layers = json.loads((path / "fedtune_layers.json").read_text())
        assert layers["base_layers"] == ([0, 3, 4, 5] if kind == "adapemu" else list(range(6)))
    assert AutoModelForCausalLM.from_pretrained(artifacts["adapemu"]["local_path"]).config.num_hidden_layers == 4


def test_adapfu_differs_from_the_base_model_only_in_adapter_layers(run: dict[str, Any]) -> None:
    base = unique_state(AutoModelForCausalLM.from_pretrained(run["model_dir"]))
    adapfu = unique_state(AutoModelForCausalLM.from_pretrained(run["summary"]["artifacts"]["adapfu"]["local_path"]))
    assert base.keys() == adapfu.keys()
    changed = {n for n in base if not torch.equal(base[n], adapfu[n])}
    assert changed and all(n.startswith(("model.layers.4.", "model.layers.5.")) for n in changed)


def test_adapemu_and_adapfu_are_registered_under_their_own_names(run: dict[str, Any]) -> None:
    client = MlflowClient(run["tracking_uri"])
    for kind in ("adapemu", "adapfu"):
        version = client.get_model_version_by_alias(f"fb-{kind}", "candidate")
        assert version.tags["algorithm"] == "fedbiot"
        assert version.tags["round"] == "2"
        assert version.tags["dropout"] == "0.5"
        assert version.tags["adapter_size"] == "2"
        assert version.tags["model"] == kind
    assert client.get_model_version_by_alias("fb-adapfu", "candidate").tags["provider_only"] == "true"


def test_broadcast_encodings_compare_full_fp32_delta_and_bf16_delta(run: dict[str, Any]) -> None:
    job = _job(run)
    store = layout.JobStores(job).provider()
    states = [ServerState.load(store, layout.state_key(r)) for r in range(job.rounds)]
    rows = transport.round_encodings([(s.group("emulator"), s.group("view")) for s in states])
    assert [row["round"] for row in rows] == [1.0, 2.0]
    first, second = rows
    assert first["delta_float32_bytes"] == first["full_bytes"]  # nothing to diff against yet
    # Realignment moves every emulator tensor: an fp32 delta is as big as the copy, bf16 half.
    assert second["delta_float32_bytes"] == second["full_bytes"]
    assert second["delta_bfloat16_bytes"] * 2 == second["full_bytes"]
    assert 0 < second["bfloat16_max_abs_error"] < 1e-3
