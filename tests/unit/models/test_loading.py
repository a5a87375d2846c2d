"""load_pretrained / save_pretrained_dir: local paths, file:// and s3:// URIs, clear errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from fedtune.core.errors import ModelError
from fedtune.models import (
    apply_lora,
    load_pretrained,
    save_pretrained_dir,
    train_tokenizer,
)

from .helpers import ARCHS, logits, sample_ids, tiny


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return train_tokenizer(["a small corpus for the loading tests"] * 4, vocab_size=300)


@pytest.fixture
def saved(tmp_path: Path, tokenizer: PreTrainedTokenizerBase) -> Path:
    return save_pretrained_dir(tiny("llama", seed=11), tokenizer, tmp_path / "model")


@pytest.mark.parametrize("arch", ARCHS)
def test_save_then_load_gives_equal_logits(
    arch: str, tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    model = tiny(arch, seed=5)
    out = save_pretrained_dir(model, tokenizer, tmp_path / "m")
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert not list(out.glob("*.bin"))
    for spec in (str(out), out.as_uri()):
        loaded, tok = load_pretrained(spec)
        assert not loaded.training and loaded.config.model_type == arch
        assert torch.equal(logits(loaded, sample_ids()), logits(model, sample_ids()))
        assert tok.get_vocab() == tokenizer.get_vocab()
        assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)


def test_dtype_argument_casts_and_default_keeps_checkpoint_dtype(saved: Path) -> None:
    assert load_pretrained(str(saved))[0].dtype == torch.float32
    assert load_pretrained(str(saved), dtype=torch.bfloat16)[0].dtype == torch.bfloat16


def test_tokenizer_spec_overrides_the_directory_tokenizer(saved: Path, tmp_path: Path) -> None:
    other = train_tokenizer(["completely different words here"] * 3, vocab_size=280)
    other.save_pretrained(str(tmp_path / "tok"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (saved / name).unlink()
    with pytest.raises(ModelError, match="has no tokenizer files"):
        load_pretrained(str(saved))
    _, tok = load_pretrained(str(saved), tokenizer=str(tmp_path / "tok"))
    assert tok.get_vocab() == other.get_vocab()


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist or is not a directory"):
        load_pretrained(str(tmp_path / "nope"))


def test_missing_config_names_path_and_contents(saved: Path) -> None:
    (saved / "config.json").unlink()
    with pytest.raises(ModelError) as info:
        load_pretrained(str(saved))
    message = str(info.value)
    assert str(saved) in message and "has no config.json" in message
    assert "model.safetensors" in message  # what was found


def test_missing_weights_names_what_was_expected(saved: Path) -> None:
    (saved / "model.safetensors").unlink()
    with pytest.raises(ModelError, match=r"has no weights: expected one of \['model.safetensors'"):
        load_pretrained(str(saved))


def test_pickled_weights_are_refused(saved: Path) -> None:
    (saved / "model.safetensors").rename(saved / "pytorch_model.bin")
    with pytest.raises(ModelError, match=r"only pickled weights \['pytorch_model.bin'\]") as info:
        load_pretrained(str(saved))
    assert "safetensors" in info.value.fix


def test_corrupt_weights_raise_model_error(saved: Path) -> None:
    (saved / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelError, match="cannot load the model in"):
        load_pretrained(str(saved))


def test_save_refuses_a_peft_model(tmp_path: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    peft_model = apply_lora(
        tiny("llama"), r=2, alpha=4.0, dropout=0.0, target_modules=None, arch="llama"
    )
    with pytest.raises(ModelError, match="got a PEFT model"):
        save_pretrained_dir(peft_model, tokenizer, tmp_path)  # type: ignore[arg-type]


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    moto = pytest.importorskip("moto")
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("FEDTUNE_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    with moto.mock_aws():
        import boto3

        boto3.client("s3").create_bucket(Bucket="models")
        yield


def test_loads_from_s3_prefix(s3: None, saved: Path) -> None:
    from fedtune.storage import open_store

    store = open_store("s3://models/tiny/v1")
    for path in saved.iterdir():
        store.put_bytes(path.name, path.read_bytes())
    model, tok = load_pretrained("s3://models/tiny/v1")
    expected, _ = load_pretrained(str(saved))
    assert torch.equal(logits(model, sample_ids()), logits(expected, sample_ids()))
    assert tok.eos_token_id == 2


def test_empty_s3_prefix_is_a_model_error(s3: None) -> None:
    with pytest.raises(ModelError, match="no model files found under 's3://models/none'"):
        load_pretrained("s3://models/none")


def test_saving_does_not_import_deepspeed(tmp_path: Path) -> None:
    # accelerate's unwrap would import DeepSpeed (and MLflow with it: seconds) on every export.
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from fedtune.models import build_tiny_model, save_pretrained_dir, train_tokenizer\n"
        "tok = train_tokenizer(['a b c d'] * 4, vocab_size=280)\n"
        "model = build_tiny_model('llama', vocab_size=len(tok), hidden_size=16, num_layers=1,"
        " num_heads=2, intermediate_size=32, max_position_embeddings=32, seed=0,"
        " bos_token_id=1, eos_token_id=2, pad_token_id=0)\n"
        f"save_pretrained_dir(model, tok, {str(tmp_path / 'm')!r})\n"
        "sys.exit('deepspeed' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "m" / "model.safetensors").is_file()
