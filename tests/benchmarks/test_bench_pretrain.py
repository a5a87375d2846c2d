"""Pretraining: deterministic weights, a loadable HF directory, learning that scoring sees."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import torch

from fedtune.benchmarks.pretrain import (
    REPORT_FILE,
    ModelShape,
    PretrainSpec,
    cached_report,
    corpus_digest,
    pretrain,
    spec_hash,
)
from fedtune.benchmarks.scoring import EvalSet, answer_correct, evaluate_model
from fedtune.cli.main import main
from fedtune.core.errors import ConfigError
from fedtune.data.synthetic import generate
from fedtune.models.loading import load_pretrained

TINY = ModelShape(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def test_ci_workspace_holds_suite_and_loadable_models(ci_workspace: Path) -> None:
    for name in ("large", "small"):
        model, tokenizer = load_pretrained(str(ci_workspace / "models" / name))
        report = json.loads((ci_workspace / "models" / name / REPORT_FILE).read_text())
        assert report["parameters"] == sum(p.numel() for p in model.parameters())
        assert set(report["test"]) >= {"em", "test_loss", "em/arithmetic", "em/count"}
        assert len(tokenizer) == model.config.vocab_size
    large = json.loads((ci_workspace / "models" / "large" / REPORT_FILE).read_text())
    small = json.loads((ci_workspace / "models" / "small" / REPORT_FILE).read_text())
    assert large["parameters"] > small["parameters"]


def test_same_seed_same_weights_other_seed_other_weights(tmp_path: Path) -> None:
    records = generate(4, seed=3)
    spec = PretrainSpec(shape=TINY, steps=3, batch_size=4, warmup_steps=1)
    pretrain(spec, records, records[:5], tmp_path / "a")
    pretrain(spec, records, records[:5], tmp_path / "b")
    pretrain(dataclasses.replace(spec, seed=1), records, records[:5], tmp_path / "c")
    weights = {k: (tmp_path / k / "model.safetensors").read_bytes() for k in "abc"}
    assert weights["a"] == weights["b"]
    assert weights["a"] != weights["c"]


def test_an_interrupted_pretraining_resumes_to_the_same_weights(tmp_path: Path) -> None:
    """Checkpoints every 2 steps; a run stopped after step 5 resumes from step 4 and ends
    bit for bit where an uninterrupted run ends, with the whole loss curve and a plot."""
    from fedtune.benchmarks.pretrain import CHECKPOINT_DIR, CURVE_PLOT, cached_report, corpus_digest
    from fedtune.benchmarks.report import is_png

    records = generate(4, seed=3)
    spec = PretrainSpec(shape=TINY, steps=7, batch_size=4, warmup_steps=1)
    whole = pretrain(spec, records, records[:5], tmp_path / "whole", checkpoint_every=2)

    class Stop(Exception):
        pass

    def stop_after_5(step: int, loss: float) -> None:
        if step == 5:
            raise Stop

    with pytest.raises(Stop):
        pretrain(spec, records, records[:5], tmp_path / "cut", progress=stop_after_5, checkpoint_every=2)
    state = json.loads((tmp_path / "cut" / CHECKPOINT_DIR / "state.json").read_text())
    assert state["step"] == 4
    resumed = pretrain(spec, records, records[:5], tmp_path / "cut", checkpoint_every=2)
    assert (tmp_path / "cut" / "model.safetensors").read_bytes() == (tmp_path / "whole" / "model.safetensors").read_bytes()
    assert resumed["loss_curve"] == whole["loss_curve"]
    assert not (tmp_path / "cut" / CHECKPOINT_DIR).exists()
    assert is_png(tmp_path / "cut" / CURVE_PLOT)
    # The finished model is found by its spec hash; another spec is not.
    assert cached_report(tmp_path / "cut", spec, corpus_digest(records)) is not None
    assert cached_report(tmp_path / "cut", dataclasses.replace(spec, steps=8), corpus_digest(records)) is None


def test_pretraining_learns_what_scoring_counts(tmp_path: Path) -> None:
    # One-token answers a tiny model memorises in a few dozen steps: exact match must rise
    # from nothing to most of the records it trained on.
    records = generate({"classify": 6}, seed=0)
    spec = PretrainSpec(shape=TINY, steps=60, batch_size=6, lr=1e-2, warmup_steps=2)
    report = pretrain(spec, records, records, tmp_path / "m")
    assert report["test"]["em/classify"] >= 0.8
    model, tokenizer = load_pretrained(str(tmp_path / "m"))
    again = evaluate_model(model, EvalSet(records, tokenizer, max_seq_len=160))
    assert again["em"] == pytest.approx(report["test"]["em"])
    assert again["test_loss"] < report["loss_curve"][0]["loss"]


@pytest.mark.parametrize(
    ("category", "prediction", "reference", "correct"),
    [
        ("arithmetic", "3 + 4 = 7. The answer is 7.", "3 + 4 = 7. The answer is 7.", True),
        ("arithmetic", "3 + 4 = 8. The answer is 7.", "3 + 4 = 7. The answer is 7.", True),
        ("arithmetic", "3 + 4 = 7. The answer is 8.", "3 + 4 = 7. The answer is 7.", False),
        ("reverse", " olleh ", "olleh", True),
        ("reverse", "olleh.", "olleh", False),
        ("classify", "Animal", "animal", False),
    ],
)
def test_answer_checks(category: str, prediction: str, reference: str, correct: bool) -> None:
    assert answer_correct(category, prediction, reference) is correct


def test_invalid_settings_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="steps=0"):
        pretrain(PretrainSpec(shape=TINY, steps=0), generate(2), generate(1), tmp_path)
    with pytest.raises(ConfigError, match="tokenizer='bpe:99'"):
        pretrain(PretrainSpec(shape=TINY, tokenizer="bpe:99"), generate(2), generate(1), tmp_path)
    with pytest.raises(ConfigError, match="micro_batches=0"):
        pretrain(PretrainSpec(shape=TINY, micro_batches=0), generate(2), generate(1), tmp_path)
    with pytest.raises(ConfigError, match="micro_batches=5 must be <= batch_size=4"):
        pretrain(PretrainSpec(shape=TINY, batch_size=4, micro_batches=5), generate(2), generate(1), tmp_path)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("parts", [2, 3, 7])
def test_a_step_in_length_sorted_passes_has_the_loss_and_gradient_of_one_pass(arch: str, parts: int) -> None:
    """Micro-batching is padding saved, not another objective: over records of every category
    (and raw self-instruct demonstrations, whose every token is a label), split unevenly, the
    step's loss and every parameter's gradient equal one pass over the whole batch."""
    from fedtune.benchmarks.pretrain import _encode_corpus, _step_loss
    from fedtune.benchmarks.self_instruct import demonstrations
    from fedtune.models.tiny import build_tiny_model
    from fedtune.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("builtin")
    corpus = generate(40, seed=5)
    records = corpus[:12] + demonstrations(corpus, 2, seed=1)
    rows = _encode_corpus(records, tokenizer, 160)
    lengths = {len(r["input_ids"]) for r in rows}
    assert len(lengths) > parts  # the premise: lengths differ, so the passes pad differently
    model = build_tiny_model(
        arch, vocab_size=len(tokenizer), hidden_size=32, num_layers=2, num_heads=2,
        intermediate_size=64, max_position_embeddings=256, seed=0,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    device = torch.device("cpu")

    def step(n: int) -> tuple[float, int, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        loss, tokens = _step_loss(model, rows, int(tokenizer.pad_token_id), n, device)
        return float(loss), tokens, {k: p.grad.clone() for k, p in model.named_parameters()}

    whole_loss, whole_tokens, whole = step(1)
    split_loss, split_tokens, split = step(parts)
    assert split_loss == pytest.approx(whole_loss, rel=1e-5)
    assert split_tokens == whole_tokens == sum(len(r["input_ids"]) for r in rows)
    for name, grad in whole.items():
        torch.testing.assert_close(split[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_the_spec_hash_names_the_tokenizer_and_keeps_earlier_hashes(tmp_path: Path) -> None:
    records = generate(4, seed=3)
    spec = PretrainSpec(shape=TINY, steps=2, batch_size=4, warmup_steps=1)
    corpus = corpus_digest(records)
    report = pretrain(spec, records, records[:5], tmp_path / "m")
    assert cached_report(tmp_path / "m", spec, corpus) == report  # kept by `bench pretrain`
    other = dataclasses.replace(spec, tokenizer="bytelevel-bpe:512")
    assert cached_report(tmp_path / "m", other, corpus) is None  # another tokenizer, another model
    # The builtin tokenizer and one pass per step hash as before those fields existed, so
    # cached and committed models stay valid; other values are other models.
    described = {k: v for k, v in spec.to_json().items() if k not in ("tokenizer", "micro_batches")}
    earlier = hashlib.sha256(json.dumps({"spec": described, "corpus": corpus}, sort_keys=True).encode()).hexdigest()
    assert spec_hash(spec, corpus) == earlier[:16]
    assert spec_hash(dataclasses.replace(spec, micro_batches=2), corpus) != earlier[:16]


# tokenizer spec -> (family marker the tokens show, architecture)
TOKENIZERS = {
    "bytelevel-bpe:400": ("Ġ", "gpt2"),
    "sentencepiece-bpe:400": ("▁", "llama"),
    "wordpiece:400": ("##", "gpt2"),
}


@pytest.mark.parametrize("tokenizer", sorted(TOKENIZERS))
def test_tenant_models_pretrain_with_their_own_tokenizer_and_architecture(
    tmp_path: Path, tokenizer: str
) -> None:
    marker, arch = TOKENIZERS[tokenizer]
    records = generate(40, seed=1)
    spec = PretrainSpec(
        shape=dataclasses.replace(TINY, arch=arch), steps=2, batch_size=4, warmup_steps=1,
        tokenizer=tokenizer,
    )
    report = pretrain(spec, records, records[:5], tmp_path / "m")
    model, loaded = load_pretrained(str(tmp_path / "m"))
    assert model.config.model_type == arch
    assert len(loaded) == report["vocab_size"] == model.config.vocab_size
    assert 300 < len(loaded) <= 400
    assert any(marker in token for token in loaded.get_vocab())
    assert report["spec"]["tokenizer"] == tokenizer


def test_minilm_wordpiece_is_the_shipped_vocabulary_made_causal() -> None:
    from fedtune.benchmarks.vocabularies import pretrain_tokenizer
    from fedtune.data.formats import to_example
    from fedtune.data.tokenize import encode_examples

    tokenizer = pretrain_tokenizer("minilm-wordpiece", [])
    assert len(tokenizer) == 30_522
    record = generate(1, seed=0)[0]
    [encoded] = encode_examples([to_example(record)], tokenizer, 512)
    ids = encoded["input_ids"]
    # [CLS] opens the prompt; [SEP] only ends the response (no BERT [SEP] after the prompt);
    # no padding or truncation to 128 tokens.
    assert ids[0] == tokenizer.cls_token_id == tokenizer.bos_token_id
    assert ids.count(tokenizer.sep_token_id) == 1 and ids[-1] == tokenizer.eos_token_id
    assert tokenizer.pad_token_id not in ids
    long_text = "word " * 300
    assert len(tokenizer(long_text)["input_ids"]) == 301


def test_cli_rejects_unknown_model_and_preset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "pretrain", "--out", str(tmp_path), "--preset", "huge"]) == 2
    assert "unknown benchmark preset 'huge'" in capsys.readouterr().err
    code = main(["bench", "pretrain", "--out", str(tmp_path), "--preset", "ci", "--models", "medium"])
    assert code == 2
    assert "medium" in capsys.readouterr().err
