"""Committed bases (benchmarks/bases/NAME): used when spec hash and corpus match, ignored with
one log line saying why when they differ, silently absent otherwise."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
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
    lines = [r.getMessage() for r in caplog.records if r.name == bases.__name__]
    assert len(lines) == 1 and "ignored" in lines[0] and reason in lines[0] and str(root / "large") in lines[0]
    assert not (tmp_path / "ws").exists()


def test_an_absent_committed_base_is_silent(committed: tuple[Path, str], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root, corpus = committed
    other = dataclasses.replace(TINY, steps=3)  # no folder holds a base of this spec
    with caplog.at_level(logging.INFO, logger=bases.__name__):
        assert adopt_committed("small", other, corpus, tmp_path / "ws", root) is None
    assert [r.getMessage() for r in caplog.records if r.name == bases.__name__] == []
    assert not (tmp_path / "ws").exists()


def test_a_base_committed_under_another_name_is_found_by_its_spec(
    committed: tuple[Path, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A preset that keeps an earlier base finds it in the folder named after its candidate,
    even where the folder of its own name holds another base (the new default's)."""
    root, corpus = committed
    assert committed_base("small", TINY, corpus, root) == root / "large"  # no "small" folder
    shelf = tmp_path / "shelf"
    shutil.copytree(root / "large", shelf / "large-earlier")
    newer = dataclasses.replace(TINY, steps=3)
    pt.pretrain(newer, generate(3, seed=7), generate(3, seed=7)[:5], shelf / "large")
    # Only the lookups' own records: pretraining above logs at INFO whenever an earlier test
    # on this worker left logging at INFO, which says nothing about the lookup.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=bases.__name__):
        assert committed_base("large", TINY, corpus, shelf) == shelf / "large-earlier"
        assert committed_base("large", newer, corpus, shelf) == shelf / "large"
    # A match anywhere is no mismatch to report.
    assert [r.getMessage() for r in caplog.records if r.name == bases.__name__] == []


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
def test_every_committed_base_is_one_a_preset_uses() -> None:
    """A folder named after a default-preset model is that model on the current corpus, and
    every other folder is a base some preset finds by its spec: a changed spec or suite must
    come with re-pretrained bases, and no base is committed that nothing uses."""
    from fedtune.benchmarks.presets import PRESETS, get_preset
    from fedtune.benchmarks.suite import build_suite

    folders = sorted(p for p in COMMITTED_BASES.iterdir() if p.is_dir()) if COMMITTED_BASES.is_dir() else []
    if not folders:
        pytest.skip("no committed bases in this checkout")
    default = get_preset("default")
    corpus = pt.corpus_digest(build_suite(default.suite).pretrain)
    for name, spec in default.models.items():
        if (COMMITTED_BASES / name).is_dir():
            assert committed_base(name, spec, corpus) == COMMITTED_BASES / name, name
    used = {
        committed_base(name, spec, corpus)
        for preset in PRESETS.values()
        if preset.suite == default.suite
        for name, spec in preset.models.items()
    }
    assert set(folders) <= used, sorted(str(f) for f in set(folders) - used)
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
