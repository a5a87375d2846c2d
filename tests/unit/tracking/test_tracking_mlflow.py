"""MlflowTracker against a real local MLflow store (SQLite), read back with MlflowClient."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from fedtune.core.errors import ConfigError, ModelError, StoreError
from fedtune.tracking import Tracker
from fedtune.tracking.digest import folder_sha256
from fedtune.tracking.mlflow_tracker import (
    MlflowTracker,
    local_tracking_uri,
    resolve_tracking_uri,
)


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    # One database per module: creating the schema costs about a second.
    return local_tracking_uri(tmp_path_factory.mktemp("mlflow"))


@pytest.fixture
def tracker(store_uri: str, request: pytest.FixtureRequest) -> MlflowTracker:
    return MlflowTracker(store_uri, experiment=request.node.name)


@pytest.fixture
def client(store_uri: str) -> MlflowClient:
    return MlflowClient(store_uri)


@pytest.fixture
def process_uri(store_uri: str) -> Iterator[None]:
    """Point mlflow's process-wide URI at the store, as a serving process would."""
    mlflow.set_tracking_uri(store_uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(None)  # type: ignore[arg-type]  # None means unset


def test_params_tags_and_metrics_per_step_are_read_back(
    tracker: MlflowTracker, client: MlflowClient
) -> None:
    assert isinstance(tracker, Tracker)
    run_id = tracker.start(
        "fedavg-3-tenants",
        params={"algorithm": {"name": "fedavg", "lora": {"r": 8}}, "rounds": 3},
        tags={"fedtune.algorithm": "fedavg"},
    )
    for step, loss in enumerate([2.5, 2.0, 1.75]):
        tracker.log_metrics({"train/loss": loss, "tenant/acme/samples": 10.0 * step}, step=step)
    tracker.log_dict({"rounds": 3}, "config/job.json")
    tracker.end("FINISHED")

    run = client.get_run(run_id)
    assert run.info.run_name == "fedavg-3-tenants"
    assert run.info.status == "FINISHED"
    assert run.data.params == {"algorithm.name": "fedavg", "algorithm.lora.r": "8", "rounds": "3"}
    assert run.data.tags["fedtune.algorithm"] == "fedavg"
    history = client.get_metric_history(run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(0, 2.5), (1, 2.0), (2, 1.75)]
    local = client.download_artifacts(run_id, "config/job.json")
    assert json.loads(Path(local).read_text()) == {"rounds": 3}


def test_secret_looking_params_tags_and_dict_entries_are_never_logged(
    tracker: MlflowTracker, client: MlflowClient
) -> None:
    secret = "s3cr3t-value-123"
    run_id = tracker.start(
        "secrets",
        params={
            "store": {"endpoint": "http://minio:9000", "aws_secret_access_key": secret},
            "hf_token": secret,
            "apiKey": secret,
            "max_new_tokens": 32,
        },
        tags={"password": secret, "owner": "provider"},
    )
    tracker.log_params({"db": {"password": secret}})
    tracker.log_dict({"s3": {"secret_key": secret, "bucket": "b"}}, "config/job.yaml")
    tracker.end("FINISHED")

    run = client.get_run(run_id)
    assert run.data.params == {"store.endpoint": "http://minio:9000", "max_new_tokens": "32"}
    assert secret not in json.dumps(run.data.tags)
    text = Path(client.download_artifacts(run_id, "config/job.yaml")).read_text()
    assert "bucket" in text and secret not in text


def test_resume_by_run_id_continues_the_same_run(
    store_uri: str, tracker: MlflowTracker, client: MlflowClient
) -> None:
    run_id = tracker.start("resumable", {"rounds": 4}, {})
    tracker.log_metrics({"loss": 3.0}, step=0)
    tracker.end("FAILED")  # the job crashed after round 0

    again = MlflowTracker(store_uri, experiment=tracker.experiment)
    assert again.start("ignored", {"rounds": 4}, {"resumed": "yes"}, run_id=run_id) == run_id
    assert client.get_run(run_id).info.status == "RUNNING"
    again.log_metrics({"loss": 2.0}, step=1)
    again.end("FINISHED")

    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["resumed"] == "yes"
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [
        (0, 3.0),
        (1, 2.0),
    ]
    assert len(client.search_runs([run.info.experiment_id])) == 1


def test_resume_rejects_unknown_runs_and_runs_of_other_experiments(
    store_uri: str, tracker: MlflowTracker
) -> None:
    with pytest.raises(StoreError, match="cannot resume MLflow run 'nope'"):
        tracker.start("x", {}, {}, run_id="nope")
    other = MlflowTracker(store_uri, experiment=tracker.experiment + "-other")
    foreign = other.start("x", {}, {})
    other.end("FINISHED")
    with pytest.raises(StoreError, match="belongs to experiment"):
        tracker.start("x", {}, {}, run_id=foreign)


def test_log_model_registers_a_servable_version_with_alias_and_tags(
    tracker: MlflowTracker,
    client: MlflowClient,
    tiny_hf_dir: Path,
    process_uri: None,
    tmp_path: Path,
) -> None:
    import pandas as pd  # type: ignore[import-untyped]
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_id = tracker.start("export", {}, {})
    tags = {"fedtune.algorithm": "fedavg", "fedtune.round": "3", "hf_token": "x"}
    ref = tracker.log_model(tiny_hf_dir, "adapter", "tiny-gpt", "candidate", tags)
    tracker.end("FINISHED")

    assert (ref.registered_name, ref.version, ref.alias) == ("tiny-gpt", 1, "candidate")
    assert ref.model_uri == "models:/tiny-gpt/1"
    mv = client.get_model_version_by_alias("tiny-gpt", "candidate")
    assert int(mv.version) == 1 and mv.run_id == run_id
    expected_tags = {"fedtune.algorithm": "fedavg", "fedtune.round": "3"}
    # The version also records what makes registration idempotent: the run and the export.
    assert mv.tags == {
        **expected_tags,
        "fedtune.run_id": run_id,
        "fedtune.content_sha256": folder_sha256(tiny_hf_dir),
    }
    assert client.get_registered_model("tiny-gpt").tags == expected_tags
    # it is an MLflow 3 logged model, linked to the run as an output
    run_outputs = client.get_run(run_id).outputs
    assert run_outputs is not None
    outputs = run_outputs.model_outputs
    assert len(outputs) == 1
    logged = client.get_logged_model(outputs[0].model_id)
    assert logged.source_run_id == run_id and logged.name == "adapter"

    model = mlflow.pyfunc.load_model("models:/tiny-gpt@candidate")
    answer = model.predict(pd.DataFrame({"prompt": ["hello tenant"]}), params={"max_new_tokens": 4})

    # the same generation straight from the directory, base weights plus the LoRA adapter
    tok = AutoTokenizer.from_pretrained(tiny_hf_dir)
    ref_model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_hf_dir), tiny_hf_dir / "adapter"
    ).eval()
    enc = tok("hello tenant", return_tensors="pt")
    with torch.no_grad():
        out = ref_model.generate(  # type: ignore[no-untyped-call]
            **enc, max_new_tokens=4, do_sample=False
        )
    assert answer == [tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)]

    requirements = Path(
        mlflow.artifacts.download_artifacts(f"{logged.artifact_location}/requirements.txt")
    ).read_text()
    assert "torchvision" not in requirements and "+cpu" not in requirements
    assert "peft==" in requirements and "transformers==" in requirements

    # a served directory comes back byte for byte, whichever way it is named
    for name in ("tiny-gpt@candidate", "models:/tiny-gpt/1", "tiny-gpt"):
        hf_dir = tracker.load_registered(name, dst_dir=tmp_path / name.replace("/", "_"))
        for rel in ("config.json", "model.safetensors", "adapter/adapter_model.safetensors"):
            assert (hf_dir / rel).read_bytes() == (tiny_hf_dir / rel).read_bytes()

    # a second export becomes version 2 and takes the alias
    tracker.start("export-2", {}, {})
    assert tracker.log_model(tiny_hf_dir, "adapter", "tiny-gpt", "candidate", {}).version == 2
    tracker.end("FINISHED")
    assert int(client.get_model_version_by_alias("tiny-gpt", "candidate").version) == 2


def test_log_model_rejects_a_folder_that_is_not_a_model(
    tracker: MlflowTracker, tmp_path: Path
) -> None:
    tracker.start("bad-model", {}, {})
    with pytest.raises(ModelError, match=r"no config\.json"):
        tracker.log_model(tmp_path, "m", "bad", None, {})
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="invalid model alias 'v2'"):
        tracker.log_model(tmp_path, "m", "bad", "v2", {})
    tracker.end("KILLED")


def test_load_registered_unknown_model_is_a_store_error(tracker: MlflowTracker) -> None:
    with pytest.raises(StoreError, match="no-such-model"):
        tracker.load_registered("no-such-model@candidate")
    with pytest.raises(StoreError, match="has no versions"):
        tracker.load_registered("no-such-model")


def test_logging_without_a_run_is_an_error(tracker: MlflowTracker, tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no active run") as info:
        tracker.log_metrics({"loss": 1.0}, step=0)
    assert "start()" in info.value.fix
    tracker.start("r", {}, {})
    with pytest.raises(StoreError, match="no such file"):
        tracker.log_artifact(tmp_path / "missing.txt")
    tracker.end("FINISHED")
    with pytest.raises(StoreError, match="no active run"):
        tracker.log_params({"a": 1})


def test_artifacts_files_and_folders(
    tracker: MlflowTracker, client: MlflowClient, tmp_path: Path
) -> None:
    (tmp_path / "report.txt").write_text("ok")
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "rouge.json").write_text("{}")
    run_id = tracker.start("artifacts", {}, {})
    tracker.log_artifact(tmp_path / "report.txt")
    tracker.log_artifact(tmp_path / "evals", artifact_path="eval")
    tracker.end("FINISHED")
    assert {a.path for a in client.list_artifacts(run_id)} == {"report.txt", "eval"}
    assert [a.path for a in client.list_artifacts(run_id, "eval")] == ["eval/rouge.json"]


def test_deleted_experiment_is_reported(tracker: MlflowTracker, client: MlflowClient) -> None:
    tracker.start("r", {}, {})
    tracker.end("FINISHED")
    experiment = client.get_experiment_by_name(tracker.experiment)
    assert experiment is not None
    client.delete_experiment(experiment.experiment_id)
    with pytest.raises(StoreError, match="is deleted"):
        tracker.start("r2", {}, {})


def test_the_file_store_is_refused_with_advice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    tracker = MlflowTracker(tmp_path.as_uri(), experiment="x")
    with pytest.raises(ConfigError, match="cannot use the tracking URI") as info:
        tracker.start("r", {}, {})
    assert "sqlite" in info.value.fix


def test_tracking_uri_resolution_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://env:5000")
    assert resolve_tracking_uri("http://explicit", "sqlite:///d.db") == "http://explicit"
    assert resolve_tracking_uri(None, "sqlite:///d.db") == "http://env:5000"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert resolve_tracking_uri(None, "sqlite:///d.db") == "sqlite:///d.db"
    with pytest.raises(ConfigError, match="no MLflow tracking URI"):
        resolve_tracking_uri(None, None)


def test_local_store_keeps_artifacts_beside_the_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    workdir = tmp_path / "work"
    workdir.mkdir()
    tracker = MlflowTracker(None, "local", default_uri=local_tracking_uri(workdir))
    run_id = tracker.start("r", {}, {})
    tracker.log_dict({"a": 1}, "a.json")
    tracker.end("FINISHED")
    artifact_uri = MlflowClient(tracker.tracking_uri).get_run(run_id).info.artifact_uri
    assert artifact_uri.startswith((workdir / "mlartifacts").as_uri())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]  # nothing in the cwd


def test_log_model_is_idempotent_per_run_and_contents(
    tracker: MlflowTracker, client: MlflowClient, tiny_hf_dir: Path
) -> None:
    """Same run, same bytes: the same version, alias untouched; new bytes: a new version."""
    run_id = tracker.start("export", {}, {})
    first = tracker.log_model(tiny_hf_dir, "model", "idem", "candidate", {})
    again = tracker.log_model(tiny_hf_dir, "model", "idem", "candidate", {})
    assert again.version == first.version == 1
    assert len(client.search_model_versions("name = 'idem'")) == 1
    (tiny_hf_dir / "generation_config.json").write_text('{"max_new_tokens": 3}')
    changed = tracker.log_model(tiny_hf_dir, "model", "idem", "candidate", {})
    assert changed.version == 2
    tracker.end("FINISHED")
    assert int(client.get_model_version_by_alias("idem", "candidate").version) == 2
    assert client.get_model_version("idem", "1").run_id == run_id


def test_a_resumed_run_logs_no_metric_point_twice(
    store_uri: str, tracker: MlflowTracker, client: MlflowClient
) -> None:
    """(key, step) is a point's identity: logged before a kill and again on resume, it is
    one row; new keys and steps are logged as usual."""
    run_id = tracker.start("metrics", {}, {})
    tracker.log_metrics({"loss": 3.0, "acc": 0.5}, step=1)
    tracker.log_metrics({"loss": 3.0}, step=1)  # the same process repeating itself
    tracker.end("FAILED")
    again = MlflowTracker(store_uri, experiment=tracker.experiment)
    again.start("metrics", {}, {}, run_id=run_id)
    again.log_metrics({"loss": 3.0, "acc": 0.5, "final/acc": 0.7}, step=1)  # a resumed round
    again.log_metrics({"loss": 2.0}, step=2)
    again.end("FINISHED")
    history = {
        key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)]
        for key in ("loss", "acc", "final/acc")
    }
    assert history == {"loss": [(1, 3.0), (2, 2.0)], "acc": [(1, 0.5)], "final/acc": [(1, 0.7)]}


def test_a_logged_model_left_by_a_kill_is_reused_not_orphaned(
    tracker: MlflowTracker, client: MlflowClient, tiny_hf_dir: Path
) -> None:
    run_id = tracker.start("export", {}, {})
    experiment = client.get_run(run_id).info.experiment_id
    # What a kill while uploading leaves: a pending logged model of the run, no version.
    left = client.create_logged_model(experiment_id=experiment, name="model", source_run_id=run_id)
    ref = tracker.log_model(tiny_hf_dir, "model", "reused", "candidate", {})
    tracker.end("FINISHED")
    logged = client.search_logged_models([experiment], filter_string=f"source_run_id = '{run_id}'")
    assert [(m.model_id, m.status.value) for m in logged] == [(left.model_id, "READY")]
    version = client.get_model_version("reused", str(ref.version))
    assert version.source == left.artifact_location
    assert [o.model_id for o in client.get_run(run_id).outputs.model_outputs] == [left.model_id]
