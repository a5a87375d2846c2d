"""Hub ids (``org/name``, ``hf://org/name``) read from a local Hugging Face cache, offline.

The cache is built by hand (tests/helpers/hub_cache.py) with a tiny Llama made from a
config: nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from transformers import LlamaForCausalLM

from fedtune.cli.main import main
from fedtune.config import load_job
from fedtune.config.loading import parse_job_text
from fedtune.core.errors import ModelError
from fedtune.engines.preflight import check_model
from fedtune.models import load_pretrained
from fedtune.models.hub import hub_repo, local_model_path
from fedtune.models.tokenizer import load_tokenizer
from fedtune.training.context import build_model
from tests.helpers.hub_cache import COMMIT, REPO, build_hub_cache

TENANTS = [
    {"name": f"tenant-{x}", "data_uri": str(Path("examples/data/quickstart").resolve() / f"tenant-{x}.jsonl")}
    for x in "abc"
]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An HF cache holding REPO at COMMIT (refs/main), and the env that points at it."""
    return build_hub_cache(tmp_path / "hf", monkeypatch)


def _job(tmp_path: Path, model: dict[str, object], **extra: object) -> Path:
    job = {
        "name": "hub", "workdir": str(tmp_path / "w"), "model": model,
        "algorithm": {"name": "fedavg"}, "rounds": 1, "min_clients": 2, "tenants": TENANTS,
        "tracking": {"backend": "none"}, **extra,
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    return path


def test_bare_id_reads_as_hub_id_unless_a_folder_of_that_name_exists(tmp_path: Path) -> None:
    path = _job(tmp_path, {"source": "pretrained", "uri": REPO, "tenant_uri": REPO}, tokenizer=REPO)
    job = load_job(path)
    assert job.model.uri == job.model.tenant_uri == job.tokenizer == f"hf://{REPO}"  # type: ignore[union-attr]
    # A data path of the same shape stays a path: only model and tokenizer fields name hub ids.
    assert job.tenants[0].data_uri.endswith("tenant-a.jsonl")
    # A job given as text (a KFP run form) has no folder to resolve against: still a hub id.
    assert parse_job_text(path.read_text()).model.uri == f"hf://{REPO}"  # type: ignore[union-attr]
    (tmp_path / REPO).mkdir(parents=True)  # a folder that exists wins
    assert load_job(path).model.uri == str(tmp_path / REPO)  # type: ignore[union-attr]
    for path_like in ("./tinyorg/tiny-llama", "models/a/b", "../x/y"):
        uri = load_job(_job(tmp_path, {"source": "pretrained", "uri": path_like, "tenant_uri": path_like})).model.uri  # type: ignore[union-attr]
        assert not uri.startswith("hf://"), path_like


def test_hub_id_loads_from_the_cache_offline(cache: Path) -> None:
    assert local_model_path(f"hf://{REPO}") == str(cache)
    model, tokenizer = load_pretrained(f"hf://{REPO}")
    reference = LlamaForCausalLM.from_pretrained(cache)
    ids = torch.tensor([[5, 6, 7]])
    assert torch.equal(model(input_ids=ids).logits, reference(input_ids=ids).logits)
    assert tokenizer.get_vocab() == load_tokenizer(f"hf://{REPO}").get_vocab()


def test_tenant_model_and_fedpt_large_model_take_hub_ids(cache: Path, tmp_path: Path) -> None:
    # A tenant reads a hub id from its own disk's cache, not through its store.
    model, _ = build_model(f"hf://{REPO}", "auto", tenant="tenant-a", store_uri="s3://b/tenant-a")
    assert model.config.hidden_size == 16
    path = _job(
        tmp_path, {"source": "pretrained", "uri": REPO, "tenant_uri": REPO},
        algorithm={"name": "fedpt", "large_model": {"source": "pretrained", "uri": "tinyorg/large"}},
        public_data_uri=str(Path("examples/data/quickstart/public.jsonl").resolve()),
    )
    job = load_job(path)
    assert job.algorithm.large_model.uri == "hf://tinyorg/large"  # type: ignore[union-attr]


def test_plain_validate_says_what_it_resolves_and_where(
    cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _job(tmp_path, {"source": "pretrained", "uri": REPO, "tenant_uri": REPO})
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"model.uri: Hugging Face model {REPO}" in out
    assert "models--tinyorg--tiny-llama" in out and f"in the cache: {cache}" in out


def test_validate_deep_checks_the_cache_and_says_how_to_fetch(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    job = load_job(_job(tmp_path, {"source": "pretrained", "uri": REPO, "tenant_uri": REPO}))
    check_model(job)  # present: the skeleton and the tokenizer load
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty"))
    with pytest.raises(ModelError) as raised:
        check_model(job)
    assert REPO in str(raised.value) and "not in the Hugging Face cache" in str(raised.value)
    assert f"hf download {REPO}" in raised.value.fix and f"huggingface-cli download {REPO}" in raised.value.fix
    # Plain validate still passes and says the model is missing and how to fetch it.
    assert main(["validate", _job(tmp_path, {"source": "pretrained", "uri": REPO, "tenant_uri": REPO}).as_posix()]) == 0
    assert "not in the cache yet (with HF_HUB_OFFLINE=1 the run fails" in capsys.readouterr().out
    assert main(["validate", "--deep", str(tmp_path / "job.yaml")]) == ModelError.exit_code


@pytest.mark.parametrize("uri", ["hf://noslash", "hf://a/b/c", "hf://org/na me", "hf://org/name@"])
def test_malformed_hub_uri_is_a_clear_error(uri: str) -> None:
    with pytest.raises(ModelError, match="not a Hugging Face model id") as raised:
        hub_repo(uri)
    assert "hf://org/name" in raised.value.fix


def test_revision_is_read_from_its_ref(cache: Path) -> None:
    assert hub_repo(f"hf://{REPO}@v1") == (REPO, "v1")
    with pytest.raises(ModelError, match="at 'v1'"):
        local_model_path(f"hf://{REPO}@v1")
    (cache.parents[1] / "refs" / "v1").write_text(COMMIT)
    assert local_model_path(f"hf://{REPO}@v1") == str(cache)


def test_a_failed_download_says_so_and_how_to_fetch(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: refused at once
    with pytest.raises(ModelError) as raised:
        local_model_path("hf://tinyorg/absent")
    assert "'tinyorg/absent'" in str(raised.value) and "download" in str(raised.value)
    assert "hf download tinyorg/absent" in raised.value.fix
    assert local_model_path(f"hf://{REPO}") == str(cache)  # a cached model needs no network


def test_a_cluster_job_says_how_to_move_a_hub_model_to_s3(tmp_path: Path) -> None:
    from fedtune.pipelines.builder import DEFAULT_CLUSTER
    from fedtune.pipelines.compiling import cluster_problems

    job = load_job(_job(tmp_path, {"source": "pretrained", "uri": REPO, "tenant_uri": REPO}))
    assert (
        f"model.uri is 'hf://{REPO}': set an s3:// URI (pods share no Hugging Face cache: "
        f"`hf download {REPO} --local-dir DIR`, upload DIR)"
    ) in cluster_problems(job, DEFAULT_CLUSTER)


def test_a_run_fetches_a_missing_model_where_validate_deep_only_looks(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = load_job(_job(tmp_path, {"source": "pretrained", "uri": "tinyorg/absent", "tenant_uri": REPO}))
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the "hub": refuses at once
    with pytest.raises(ModelError, match="looked without downloading"):
        check_model(job)  # validate --deep
    with pytest.raises(ModelError, match="downloading it failed: .*Connection refused"):
        check_model(job, download=True)  # the run's preflight tried the hub
