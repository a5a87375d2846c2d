"""Committed bases (benchmarks/bases/NAME): used when spec hash and corpus match, ignored with
one log line saying why when they differ, silently absent otherwise."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest

from fedtune.benchmarks import bases, pretrain as pt
from fedtune.benchmarks.bases import COMMITTED_BASES, adopt_committed, committed_base
from fedtune.data.synthetic import generate

TINY = pt.PretrainSpec(
    shape=pt.ModelShape(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32),
    steps=2,
    batch_size=4,
    warmup_steps=1,
)


@pytest.fixture(scope="module")
def committed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A root holding one committed base ``large`` and the corpus digest it was made on."""
    records = generate(3, seed=7)
    root = tmp_path_factory.mktemp("bases")
    pt.pretrain(TINY, records, records[:5], root / "large")
    return root, pt.corpus_digest(records)


def test_a_matching_committed_base_is_copied_and_then_cached(committed: tuple[Path, str], tmp_path: Path) -> None:
    root, corpus = committed
    assert committed_base("large", TINY, corpus, root) == root / "large"
    report = adopt_committed("large", TINY, corpus, tmp_path / "ws", root)
    assert report is not None and report["corpus_sha256"] == corpus
    assert (tmp_path / "ws" / "model.safetensors").read_bytes() == (root / "large" / "model.safetensors").read_bytes()
    assert pt.cached_report(tmp_path / "ws", TINY, corpus) == report
    assert "torch" in report["machine"] and report["loss_curve"] and report["seconds"] > 0


@pytest.mark.parametrize(
    ("change", "reason"),
    [("spec", "spec hash"), ("corpus", "corpus")],
)
def test_a_mismatching_committed_base_is_ignored_with_one_line_why(
    committed: tuple[Path, str], tmp_path: Path, caplog: pytest.LogCaptureFixture, change: str, reason: str
) -> None:
    root, corpus = committed
    spec = dataclasses.replace(TINY, steps=3) if change == "spec" else TINY
    asked = corpus if change == "spec" else "0" * 64
    with caplog.at_level(logging.INFO, logger=bases.__name__):
        assert adopt_committed("large", spec, asked, tmp_path / "ws", root) is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "ignored" in lines[0] and reason in lines[0] and str(root / "large") in lines[0]
    assert not (tmp_path / "ws").exists()


def test_an_absent_committed_base_is_silent(committed: tuple[Path, str], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root, corpus = committed
    with caplog.at_level(logging.INFO, logger=bases.__name__):
        assert adopt_committed("small", TINY, corpus, tmp_path / "ws", root) is None
    assert caplog.records == []


def test_bench_pretrain_copies_a_committed_base_instead_of_pretraining(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedtune.cli.main import main

    common = ["bench", "pretrain", "--preset", "ci", "--models", "small", "--threads", "1"]
    assert main([*common, "--out", str(tmp_path / "made")]) == 0
    monkeypatch.setattr(bases, "COMMITTED_BASES", tmp_path / "made" / "models")
    capsys.readouterr()
    assert main([*common, "--out", str(tmp_path / "ws")]) == 0
    assert "the committed base of this spec" in capsys.readouterr().out
    made, copied = (tmp_path / d / "models" / "small" for d in ("made", "ws"))
    assert (copied / "model.safetensors").read_bytes() == (made / "model.safetensors").read_bytes()
    assert (copied / pt.REPORT_FILE).read_text() == (made / pt.REPORT_FILE).read_text()


@pytest.mark.slow
def test_the_committed_bases_are_those_of_the_default_preset() -> None:
    """Every folder in benchmarks/bases is a base of the default preset on its current
    corpus: a changed spec or suite must come with re-pretrained bases."""
    from fedtune.benchmarks.presets import get_preset
    from fedtune.benchmarks.suite import build_suite

    names = sorted(p.name for p in COMMITTED_BASES.iterdir()) if COMMITTED_BASES.is_dir() else []
    if not names:
        pytest.skip("no committed bases in this checkout")
    preset = get_preset("default")
    corpus = pt.corpus_digest(build_suite(preset.suite).pretrain)
    assert set(names) <= set(preset.models)
    for name in names:
        assert committed_base(name, preset.models[name], corpus) == COMMITTED_BASES / name, name
    total = sum(f.stat().st_size for f in COMMITTED_BASES.rglob("*") if f.is_file())
    assert total <= 25_000_000


def test_the_docs_row_of_a_committed_base_is_its_report() -> None:
    """Every committed base renders as one row naming its spec hash, corpus and scores, so
    the page's base table cannot drift from the weights it describes."""
    reports = sorted(COMMITTED_BASES.glob(f"*/{pt.REPORT_FILE}"))
    assert reports, "no committed base"
    for path in reports:
        report = json.loads(path.read_text("utf-8"))
        header, rule, row = bases.base_markdown(report).splitlines()
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == header.count("|") - 1 == rule.count("|") - 1
        assert report["spec_hash"] in cells and report["corpus_sha256"][:12] in cells
        assert f"{report['test']['em']:.3f}" in cells and f"{report['parameters']:,}" in cells
