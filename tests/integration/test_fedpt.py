"""Whole FedPT / FedAvg+PT runs on the in-process engine with a real MLflow store.

Checked as a provider and a tenant would: only the small adapter crosses the boundary (and
its bytes are the adapter's), the large model is queried once per job (a real HTTP endpoint
counts the requests), FedAvg+PT trains exactly what FedAvg trains, and the registered
composite generates what Eq. 3 decoding on the exported parts generates.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
import pytest
import torch
from mlflow import MlflowClient
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from fedtune.algorithms.fedpt import proxy
from fedtune.config import parse_job
from fedtune.core.errors import ModelError
from fedtune.core.messages import ServerState
from fedtune.engines import layout
from fedtune.engines.local import RunOptions, run_job
from fedtune.models import build_tiny_model, load_tokenizer
from fedtune.models.prompt_frame import framed, read_template
from fedtune.serving.mlflow_registry import ModelRegistry
from fedtune.serving.refs import parse_model_spec
from fedtune.tracking.base import NullTracker
from fedtune.tracking.mlflow_tracker import MlflowTracker, local_tracking_uri
from tests.helpers.completions_server import CompletionsServer
from tests.integration.conftest import DATA, tiny_job_dict

pytestmark = pytest.mark.slow

LARGE = {
    "source": "tiny",
    "arch": "llama",
    "hidden_size": 48,
    "num_layers": 3,
    "num_heads": 2,
    "intermediate_size": 96,
    "max_position_embeddings": 128,
    "init_seed": 1,
}
FEDPT = {
    "name": "fedpt",
    "large_model": LARGE,
    "alpha": 1.0,
    "gamma": 1.0,
    "kd_size": 16,
    "kd_batch_size": 4,
    "kd_steps": 2,
    "max_new_tokens": 6,
    "max_generation_examples": 2,
}


def _job_dict(workdir: Path, algorithm: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    return tiny_job_dict(
        workdir,
        name="fpt",
        algorithm=algorithm,
        public_data_uri=str(DATA / "public.jsonl"),
        **overrides,
    )


def _digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.contiguous().numpy().tobytes()).hexdigest()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("fedpt")
    job = parse_job(_job_dict(root / "work", FEDPT))
    tracking_uri = local_tracking_uri(root / "mlflow")
    summary = run_job(job, MlflowTracker(tracking_uri, experiment="fedpt-itest"), RunOptions(progress=False))
    return {"job": job, "summary": summary, "tracking_uri": tracking_uri}


def test_only_the_small_adapter_crosses_and_its_bytes_are_the_adapters(run: dict[str, Any]) -> None:
    job, summary = run["job"], run["summary"]
    workdir = Path(job.workdir)
    exchanged = list((workdir / "exchange").rglob("*.safetensors"))
    assert exchanged
    adapter_bytes = 0
    for blob in exchanged:
        tensors = load_file(str(blob))
        assert tensors and all(name.startswith("adapter/") for name in tensors), blob
        adapter_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    # The large model's weights are nowhere but the provider's private store and its export.
    export = Path(summary["artifacts"]["model"]["local_path"])
    large = load_file(str(next((export / "large").glob("*.safetensors"))))
    large_digests = {_digest(t) for t in large.values()}
    assert len(large_digests) > 10
    for blob in workdir.rglob("*.safetensors"):
        if blob.relative_to(workdir).parts[0] in ("provider", "artifacts"):
            continue
        assert not large_digests & {_digest(t) for t in load_file(str(blob)).values()}, blob
    for round_summary in summary["rounds"]:
        for tenant in round_summary["tenants"].values():
            assert tenant["raw_update_bytes"] == adapter_bytes
            # What crossed each way: the adapter's tensors plus a safetensors header.
            for crossed in (tenant["bytes_sent"], tenant["bytes_received"]):
                assert adapter_bytes < crossed < adapter_bytes + 2048


def test_the_large_model_is_queried_once_per_job_and_cached_in_the_provider_store(
    run: dict[str, Any],
) -> None:
    job, summary = run["job"], run["summary"]
    provider = layout.JobStores(job).provider()
    cached = [k for k in provider.list("fedpt/") if k.endswith(".safetensors")]
    assert len(cached) == 1 and cached[0].startswith("fedpt/large-logprobs-")
    assert all(t.dtype == torch.float16 for t in provider.get_tensors(cached[0]).values())
    initial = provider.get_json(f"{layout.state_key(0)}.json")  # its record outlives pruning
    heldout = round(100 * 0.1)
    assert initial["large_queries"] == FEDPT["kd_size"] + heldout
    assert [r["server_metrics"]["fedpt/large_queries"] for r in summary["rounds"]] == [0.0, 0.0]
    for round_summary in summary["rounds"]:
        metrics = round_summary["server_metrics"]
        assert metrics["kd/steps"] == FEDPT["kd_steps"]
        for key in ("kd/train_kl", "kd/heldout_kl_before", "kd/heldout_kl_after"):
            assert 0.0 <= metrics[key] < 20.0, key
        assert 0.0 <= metrics["eval/proxy/rouge_l"] <= 1.0


def test_composite_and_small_model_are_registered_and_the_composite_decodes_eq3(
    run: dict[str, Any],
) -> None:
    client = MlflowClient(run["tracking_uri"])
    composite = client.get_model_version_by_alias("fpt", "candidate")
    small = client.get_model_version_by_alias("fpt-small", "candidate")
    assert composite.tags["fedtune.layout"] == "proxy-tuned" and composite.tags["alpha"] == "1.0"
    assert small.tags["algorithm"] == "fedpt"

    export = Path(run["summary"]["artifacts"]["model"]["local_path"])
    tokenizer = load_tokenizer(str(export / "small"))
    large = AutoModelForCausalLM.from_pretrained(export / "large").eval()
    pre = AutoModelForCausalLM.from_pretrained(export / "small").eval()
    tuned = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(export / "small"), export / "small" / "adapter"
    ).eval()
    prompt = "Give three tips for staying healthy."
    # A bare instruction is served as training framed it: in the small model's saved template.
    template = read_template(export / "small")
    assert template is not None
    ids = tokenizer(framed(prompt, template))["input_ids"]
    expected = proxy.generate(large, pre, tuned, ids, 1.0, max_new_tokens=8, eos_token_id=tokenizer.eos_token_id)
    assert expected
    mlflow.set_tracking_uri(run["tracking_uri"])
    try:
        served = mlflow.pyfunc.load_model("models:/fpt@candidate")
    finally:
        mlflow.set_tracking_uri(None)  # type: ignore[arg-type]  # None means unset
    answer = tokenizer.decode(expected, skip_special_tokens=True)
    got = served.predict(
        pd.DataFrame({"prompt": [prompt, framed(prompt, template)]}), params={"max_new_tokens": 8}
    )
    assert list(got) == [answer, answer]  # an already framed prompt is not framed twice


def test_promoting_the_composite_to_kserve_says_what_to_serve_instead(run: dict[str, Any]) -> None:
    registry = ModelRegistry(run["tracking_uri"])
    record = registry.version(parse_model_spec("fpt@candidate"))
    with pytest.raises(ModelError, match="proxy-tuned composite") as err:
        registry.hf_subpath(record)
    assert "serve-local" in err.value.fix and "fpt-small" in err.value.fix
    assert registry.hf_subpath(registry.version(parse_model_spec("fpt-small@candidate")))


def test_fedavg_pt_trains_exactly_what_fedavg_trains(tmp_path: Path) -> None:
    finals = {}
    for name, algorithm in {
        "fedavg": {"name": "fedavg"},
        "fedavg-pt": {"name": "fedavg-pt", "large_model": LARGE, "max_new_tokens": 4, "max_generation_examples": 1},
    }.items():
        job = parse_job(_job_dict(tmp_path / name, algorithm))
        summary = run_job(job, NullTracker(), RunOptions(progress=False))
        assert summary["completed"]
        state = ServerState.load(layout.JobStores(job).provider(), layout.state_key(job.rounds))
        finals[name] = state.group("adapter")
    assert finals["fedavg"].keys() == finals["fedavg-pt"].keys()
    for key, tensor in finals["fedavg"].items():
        assert torch.equal(tensor, finals["fedavg-pt"][key]), key


def test_an_http_large_model_is_queried_only_before_round_one(tmp_path: Path) -> None:
    """A real completions endpoint counts requests: the probe and one pass over the public rows."""
    tokenizer = load_tokenizer("builtin")
    model = build_tiny_model(
        "llama", vocab_size=len(tokenizer), hidden_size=48, num_layers=3, num_heads=2,
        intermediate_size=96, max_position_embeddings=128, seed=1,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    ).eval()
    server = CompletionsServer(model, tokenizer).start()
    try:
        http = {
            "source": "http", "url": server.url, "model": "tiny-large",
            "tokenizer": "builtin", "top_k": 50, "batch_size": 8,
        }
        # eval_every beyond the last round: generation would decode through the endpoint.
        algorithm = FEDPT | {"large_model": http, "eval_every": 100}
        counts = []
        for rounds in (1, 3):
            before = len(server.requests)
            job = parse_job(_job_dict(tmp_path / f"r{rounds}", algorithm, rounds=rounds))
            summary = run_job(job, NullTracker(), RunOptions(progress=False))
            assert summary["completed"]
            counts.append(len(server.requests) - before)
        # Rows are scored in kd_batch_size (4) batches, each one request of <= 8 prompts.
        batches = -(-(FEDPT["kd_size"] + 10) // 4)
        assert counts == [1 + batches, 1 + batches]
    finally:
        server.stop()
