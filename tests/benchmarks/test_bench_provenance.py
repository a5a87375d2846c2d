"""A benchmark's JSON names the commit of the code that measured it, also from a copy
without git history (a container image, the tree sent to a GPU machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedtune.benchmarks import provenance


def test_a_folder_outside_git_has_no_commit(tmp_path: Path) -> None:
    assert provenance.git_commit(tmp_path) is None


def test_a_copy_without_git_takes_the_commit_its_sender_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The package itself lives in this git checkout; run the lookup from a plain folder.
    monkeypatch.setattr(provenance, "__file__", str(tmp_path / "pkg" / "provenance.py"))
    monkeypatch.delenv("FEDTUNE_SOURCE_COMMIT", raising=False)
    assert provenance.source_commit() == "unknown"
    monkeypatch.setenv("FEDTUNE_SOURCE_COMMIT", "abc1234")
    assert provenance.source_commit() == "abc1234"


def test_the_named_commit_wins_over_a_checkout_and_git_answers_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A copy's .git can be older than its files (the GPU machines' copies are): the sender's
    # explicit name is the one to trust; without it, the checkout's own commit.
    monkeypatch.setenv("FEDTUNE_SOURCE_COMMIT", "abc1234")
    assert provenance.source_commit() == "abc1234"
    monkeypatch.delenv("FEDTUNE_SOURCE_COMMIT")
    assert provenance.source_commit() == provenance.git_commit(Path(provenance.__file__).parent)
    assert provenance.source_commit() not in ("abc1234", "unknown")
