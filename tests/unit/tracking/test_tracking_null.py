"""The do-nothing tracker."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedtune.tracking import ModelRef, NullTracker, Tracker


def test_null_tracker_does_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    tracker = NullTracker()
    assert isinstance(tracker, Tracker)
    assert tracker.start("run", {"a": {"b": 1}}, {"t": "x"}) == "null"
    assert tracker.start("run", {}, {}, run_id="abc") == "null"
    tracker.log_params({"x": 1})
    tracker.log_metrics({"loss": 0.5}, step=3)
    tracker.log_dict({"k": 1}, "config.json")
    tracker.log_artifact(tmp_path / "missing.txt")
    model_dir = tmp_path / "model"
    ref = tracker.log_model(model_dir, "final", "tiny", "candidate", {"a": "b"})
    assert ref == ModelRef(model_dir.resolve().as_uri(), "tiny", 0, "candidate")
    tracker.end("FAILED")
    assert list(tmp_path.iterdir()) == []  # nothing was written anywhere
