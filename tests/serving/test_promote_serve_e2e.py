"""`fedtune promote` and `fedtune serve-local` on a model the local engine trained and registered.

One tiny job runs once for the module (MLflow and transformers are slow to import). Its MLflow
store is SQLite, and its artifacts live in S3 (a moto server), like the chart's MLflow with an
object store, so the InferenceService points at a real physical location the test can read.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from fedtune.cli.main import main
from fedtune.serving.gate import AUDIT_TAG, GATE_TAG
from fedtune.serving.schema import validate_inferenceservice
from tests.helpers.moto import (
    admin_client,
    create_bucket,
    start_moto_server,
    use_fake_aws_env,
)
from tests.integration.conftest import tiny_job_dict

pytestmark = pytest.mark.slow

NAME = "itest"  # the tiny job's name, which is its registered model's name
PROMPT = "Reverse the word: apple"
TIMEOUT = 120  # seconds for anything that waits on a model load


@dataclass(frozen=True)
class Registered:
    uri: str
    endpoint: str
    bucket: str
    summary: dict[str, Any]

    def client(self) -> Any:
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registered]:
    from mlflow import MlflowClient

    from fedtune.config import parse_job
    from fedtune.engines.local import RunOptions, run_job
    from fedtune.tracking.factory import make_tracker

    server = start_moto_server()
    try:
        with pytest.MonkeyPatch.context() as mp:
            use_fake_aws_env(mp, server.endpoint_url)
            mp.setenv("MLFLOW_S3_ENDPOINT_URL", server.endpoint_url)
            mp.delenv("MLFLOW_TRACKING_URI", raising=False)
            bucket = create_bucket(server.endpoint_url)
            work = tmp_path_factory.mktemp("registered")
            uri = f"sqlite:///{work}/mlflow.db"
            # The experiment keeps artifacts in the object store, as behind the chart's MLflow.
            MlflowClient(uri).create_experiment(
                "fedtune", artifact_location=f"s3://{bucket}/mlartifacts"
            )
            job = parse_job(
                tiny_job_dict(
                    work,
                    rounds=1,
                    tracking={"backend": "mlflow", "tracking_uri": uri},
                    export={"merged": True},  # promotion without --lora serves merged/
                )
            )
            summary = run_job(job, make_tracker(job), RunOptions(progress=False))
            yield Registered(uri, server.endpoint_url, bucket, summary)
    finally:
        server.stop()


def s3_has(registered: Registered, uri: str) -> bool:
    parts = urlsplit(uri)
    assert parts.scheme == "s3" and parts.netloc == registered.bucket, uri
    found = admin_client(registered.endpoint).list_objects_v2(
        Bucket=parts.netloc, Prefix=parts.path.lstrip("/"), MaxKeys=1
    )
    return int(found.get("KeyCount", 0)) > 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- promote ----------------------------------------------------------------------------------


def test_promote_moves_the_alias_and_writes_a_valid_inferenceservice(
    registered: Registered, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    client = registered.client()
    assert registered.summary["artifacts"]["model"]["registered_version"] == 1
    client.set_model_version_tag(NAME, "1", AUDIT_TAG, "0.1")
    out = tmp_path / "isvc.yaml"
    code = main(
        [
            "promote",
            NAME,
            "--version",
            "1",
            "--alias",
            "champion",
            "--tracking-uri",
            registered.uri,
            "--max-leakage",
            "0.5",
            "--kserve-out",
            str(out),
            "--namespace",
            "fedtune-serving",
        ]
    )
    stdout = capsys.readouterr().out
    assert code == 0
    assert f"{NAME}@champion -> version 1 (new alias)" in stdout
    assert "memorization 0.1000 <= 0.5000" in stdout
    assert int(client.get_model_version_by_alias(NAME, "champion").version) == 1
    assert int(client.get_model_version_by_alias(NAME, "candidate").version) == 1  # untouched

    doc = yaml.safe_load(out.read_text())
    validate_inferenceservice(doc)
    assert doc["metadata"]["name"] == f"{NAME}-champion"
    assert doc["metadata"]["namespace"] == "fedtune-serving"
    assert doc["metadata"]["annotations"]["fedtune.io/audit-memorization"] == "0.1"
    model = doc["spec"]["predictor"]["model"]
    # The physical object-store location of the version's merged Hugging Face directory:
    # without --lora, the runtime must get weights that already hold the adapter.
    storage = model["storageUri"]
    assert storage.startswith(f"s3://{registered.bucket}/mlartifacts/")
    assert storage.endswith("/merged")
    assert s3_has(registered, f"{storage}/config.json")
    assert s3_has(registered, f"{storage}/model.safetensors")
    assert not s3_has(registered, f"{storage}/adapter/adapter_config.json")
    assert model["args"] == [f"--model_name={NAME}-champion"]


def test_promote_with_lora_serves_the_adapter_of_the_llama_model(
    registered: Registered, tmp_path: Path
) -> None:
    registered.client().set_model_version_tag(NAME, "1", AUDIT_TAG, "0.1")
    out = tmp_path / "lora.yaml"
    code = main(
        [
            "promote",
            NAME,
            "--version",
            "1",
            "--alias",
            "champion",
            "--tracking-uri",
            registered.uri,
            "--kserve-out",
            str(out),
            "--lora",
            "--isvc-name",
            "chat",
        ]
    )
    assert code == 0
    doc = yaml.safe_load(out.read_text())
    validate_inferenceservice(doc)
    args = doc["spec"]["predictor"]["model"]["args"]
    assert args == [
        "--model_name=chat",
        "--enable-lora",
        "--lora-modules",
        "chat-lora=/mnt/models/adapter",
    ]


def test_promote_moves_an_alias_from_another_version(
    registered: Registered, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    client = registered.client()
    first = client.get_model_version(NAME, "1")
    second = client.create_model_version(NAME, source=first.source, run_id=first.run_id)
    client.set_registered_model_alias(NAME, "staging", "1")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", registered.uri)  # the fallback after --tracking-uri
    code = main(["promote", NAME, "--version", str(second.version), "--alias", "staging"])
    assert code == 0
    assert f"-> version {second.version} (was version 1)" in capsys.readouterr().out
    assert int(client.get_model_version_by_alias(NAME, "staging").version) == int(second.version)


GATE_CASES = {
    # name: (version tags to set or delete (None), model tags, extra args, error fragment)
    "audit missing, cli threshold": (
        {AUDIT_TAG: None},
        {},
        ["--max-leakage", "0.3"],
        "has no audit result",
    ),
    "audit too high": (
        {AUDIT_TAG: "0.9"},
        {},
        ["--max-leakage", "0.3"],
        "exceeds the leakage threshold",
    ),
    "audit too high for the model's gate tag": (
        {AUDIT_TAG: "0.5"},
        {GATE_TAG: "0.2"},
        [],
        "exceeds",
    ),
    "audit required but missing": ({AUDIT_TAG: None}, {}, ["--require-audit"], "--require-audit"),
}


@pytest.mark.parametrize("case", sorted(GATE_CASES))
def test_the_leakage_gate_refuses_and_leaves_the_registry_alone(
    registered: Registered, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    version_tags, model_tags, extra, fragment = GATE_CASES[case]
    client = registered.client()
    for key, value in version_tags.items():
        if value is None:
            client.delete_model_version_tag(NAME, "1", key)
        else:
            client.set_model_version_tag(NAME, "1", key, value)
    for key, value in model_tags.items():
        client.set_registered_model_tag(NAME, key, value)
    out = tmp_path / "isvc.yaml"
    try:
        code = main(
            [
                "promote",
                NAME,
                "--version",
                "1",
                "--alias",
                "gated",
                "--tracking-uri",
                registered.uri,
                "--kserve-out",
                str(out),
                *extra,
            ]
        )
    finally:
        for key in model_tags:
            client.delete_registered_model_tag(NAME, key)
    err = capsys.readouterr().err
    assert code == 8
    assert fragment in err and "fix:" in err
    assert "gated" not in client.get_registered_model(NAME).aliases
    assert not out.exists() and not list(tmp_path.iterdir())


ERROR_CASES = {
    # name: (argv after the command, exit code, fragments of stderr)
    "unknown model": (
        ["promote", "nosuch", "--version", "1"],
        4,
        ["no registered model 'nosuch'", "['itest']"],
    ),
    "unknown version": (["promote", NAME, "--version", "99"], 4, ["has no version 99", "[1"]),
    "version not a number": (
        ["promote", NAME, "--version", "latest"],
        2,
        ["invalid model version"],
    ),
    "invalid alias": (
        ["promote", NAME, "--version", "1", "--alias", "Prod!"],
        2,
        ["invalid model alias 'Prod!'"],
    ),
    "reserved alias": (
        ["promote", NAME, "--version", "1", "--alias", "v2"],
        2,
        ["invalid model alias"],
    ),
    "serve unknown alias": (
        ["serve-local", f"{NAME}@nosuch", "--prompt", "hi"],
        4,
        ["has no alias 'nosuch'"],
    ),
    "serve nothing to do": (["serve-local", f"{NAME}@champion"], 2, ["no --prompt and no --port"]),
}


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_error_paths_exit_with_a_message_and_a_fix(
    registered: Registered, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    argv, code, fragments = ERROR_CASES[case]
    assert main([*argv, "--tracking-uri", registered.uri]) == code
    err = capsys.readouterr().err
    for fragment in fragments:
        assert fragment in err
    assert "fix:" in err


def test_unreachable_or_missing_tracking_stores_fail_fast(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    assert (
        main(["promote", NAME, "--version", "1", "--tracking-uri", f"http://127.0.0.1:{port}"]) == 4
    )
    assert (
        f"cannot reach the MLflow tracking server at 'http://127.0.0.1:{port}'"
        in capsys.readouterr().err
    )
    missing = tmp_path / "none.db"
    assert (
        main(
            [
                "serve-local",
                f"{NAME}@champion",
                "--prompt",
                "hi",
                "--tracking-uri",
                f"sqlite:///{missing}",
            ]
        )
        == 4
    )
    assert "no MLflow database" in capsys.readouterr().err
    assert not missing.exists()  # never creates an empty store
    # Without flag and environment: the quickstart's store under the working directory.
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["promote", NAME, "--version", "1"]) == 4
    assert str(tmp_path / ".fedtune" / "mlflow.db") in capsys.readouterr().err


# -- serve-local ------------------------------------------------------------------------------


class _PortFromLog(logging.Handler):
    """Catches the URL the server logs once it listens."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.url: str | None = None
        self.ready = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("serving ") and " on http://" in record.getMessage():
            self.url = record.getMessage().rsplit(" on ", 1)[1]
            self.ready.set()


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_serve_local_answers_on_the_command_line_and_over_http(
    registered: Registered, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = registered.uri
    assert (
        main(["promote", NAME, "--version", "1", "--alias", "served", "--tracking-uri", uri]) == 0
    )
    capsys.readouterr()
    code = main(
        [
            "serve-local",
            f"{NAME}@served",
            "--prompt",
            PROMPT,
            "--prompt",
            "hello",
            "--max-new-tokens",
            "6",
            "--json",
            "--tracking-uri",
            uri,
        ]
    )
    assert code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["prompt"] for line in lines] == [PROMPT, "hello"]
    cli_answer = lines[0]["text"]
    assert cli_answer.strip()

    logger = logging.getLogger("fedtune.serving.local_server")
    catcher = _PortFromLog()
    previous = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(catcher)
    result: dict[str, int] = {}
    argv = [
        "serve-local",
        f"{NAME}@served",
        "--port",
        "0",
        "--max-requests",
        "3",
        "--max-new-tokens",
        "6",
        "--tracking-uri",
        uri,
    ]
    thread = threading.Thread(target=lambda: result.setdefault("code", main(argv)), daemon=True)
    thread.start()
    try:
        assert catcher.ready.wait(TIMEOUT), "the server never started"
        assert catcher.url is not None
        with urllib.request.urlopen(f"{catcher.url}/health", timeout=TIMEOUT) as response:
            assert json.loads(response.read()) == {"status": "ok", "model": f"{NAME}@served"}
        status, body = post(f"{catcher.url}/v1/completions", {"prompt": PROMPT, "max_tokens": 6})
        assert status == 200
        assert body["model"] == f"{NAME}@served" and body["object"] == "text_completion"
        assert [c["text"] for c in body["choices"]] == [cli_answer]  # greedy: same answer
        assert post(f"{catcher.url}/v1/completions", {"prompt": 42})[0] == 400
        thread.join(TIMEOUT)  # the third request was the last one allowed
        assert not thread.is_alive()
        assert result["code"] == 0
    finally:
        logger.removeHandler(catcher)
        logger.setLevel(previous)


def test_the_served_model_computes_what_was_trained(registered: Registered, tmp_path: Path) -> None:
    """Reference: the exported base weights plus adapter/, loaded with transformers + PEFT;
    the adapter must be applied exactly once and must change the model."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from fedtune.serving.mlflow_registry import ModelRegistry, load_pyfunc
    from fedtune.serving.refs import ModelSpec

    registry = ModelRegistry(registered.uri)
    local = registry.download(registry.version(ModelSpec(NAME, version=1)), tmp_path)
    served = load_pyfunc(local).unwrap_python_model()
    model_dir = local / registry.hf_subpath(registry.version(ModelSpec(NAME, version=1)))
    base = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    inputs = served.tokenizer(PROMPT, return_tensors="pt")
    with torch.no_grad():
        base_logits = base(**inputs).logits
        reference = PeftModel.from_pretrained(base, model_dir / "adapter").eval()
        torch.testing.assert_close(served.model(**inputs).logits, reference(**inputs).logits)
        assert not torch.allclose(served.model(**inputs).logits, base_logits)
