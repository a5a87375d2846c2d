"""The per-table presets (issue 16): valid before anything runs, tuned methods selected on the
validation split, and one of them end to end at the smoke sizes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from fedtune.benchmarks.presets import PRESETS, get_preset
from fedtune.benchmarks.quality import QualitySpec, _check
from fedtune.benchmarks.selection import select_tuned
from fedtune.benchmarks.suite import build_suite
from fedtune.cli.main import main
from fedtune.core.errors import ConfigError

TABLES = ("fedbiot", "fedbiot-ablation", "fedopt-tuned", "fedprox-mu", "scaffold-sgd")


@pytest.mark.parametrize("name", TABLES)
@pytest.mark.parametrize("smoke", [False, True])
def test_table_presets_are_valid(name: str, smoke: bool) -> None:
    preset = get_preset(name, smoke_test=smoke)
    _check(preset.quality)  # every label, setting and grid is checked before any run
    if name.startswith("fedbiot"):
        # Eight layers: dropping layers changes the model, the adapter sits on real depth.
        assert preset.models["large"].shape.num_layers >= 8
    if smoke:
        assert preset.quality.seeds == (0, 1) and preset.quality.rounds == 1
    else:
        assert len(preset.quality.seeds) == 5


def test_fedbiot_preset_follows_the_paper() -> None:
    spec = PRESETS["fedbiot"].quality
    assert spec.optimizer == "sgd"
    assert spec.algorithm_params["fedbiot"] | {"eps": 1.0, "kl_lambda": 0.0, "align_steps": 10} == spec.algorithm_params["fedbiot"]
    for dropout in ("0.2", "0.5"):
        assert {f"{a}@dropout={dropout}" for a in ("fedbiot", "fedot", "offsite-tuning")} <= set(spec.algorithms)
    assert "fedavg" in spec.algorithms


def test_selection_needs_the_validation_split_and_running_grids() -> None:
    spec = QualitySpec(algorithms=("fedavg", "fedadam@eta=0.1"), baselines=(), select={"fedadam": ("fedadam@eta=0.1",)})
    with pytest.raises(ConfigError, match="validation"):
        _check(spec)
    with pytest.raises(ConfigError, match="fedadam@eta=1"):
        _check(dataclasses.replace(spec, validation=True, select={"fedadam": ("fedadam@eta=1",)}))


def _run(method: str, seed: int, val: float, loss: float, test: float) -> dict[str, Any]:
    return {"method": method, "kind": "algorithm", "seed": seed, "seconds": 1.0,
            "rounds": [{"round": 1.0, "em": test, "val/em": val, "val/loss": loss}]}


def test_the_best_validation_point_is_reported_on_test() -> None:
    runs = [
        # a: best test EM, worst validation EM -> not chosen (selection never sees test).
        _run("x@eta=1", 0, 0.1, 1.0, 0.9), _run("x@eta=1", 1, 0.1, 1.0, 0.9),
        # b and c tie on mean validation EM; c has the lower validation loss.
        _run("x@eta=2", 0, 0.5, 1.0, 0.2), _run("x@eta=2", 1, 0.25, 1.0, 0.2),
        _run("x@eta=3", 0, 0.375, 0.5, 0.3), _run("x@eta=3", 1, 0.375, 0.5, 0.4),
    ]
    chosen, selection = select_tuned(runs, {"x": ("x@eta=1", "x@eta=2", "x@eta=3")})
    assert selection["x"]["selected"] == "x@eta=3"
    assert [p["val_em"] for p in selection["x"]["grid"]] == pytest.approx([0.1, 0.375, 0.375])
    assert [(r["method"], r["seed"], r["rounds"][-1]["em"]) for r in chosen] == [("x", 0, 0.3), ("x", 1, 0.4)]
    assert all(r["selected"] == "x@eta=3" for r in chosen)


def test_validation_split_repeats_no_other_set() -> None:
    suite = build_suite(get_preset("ci").suite)
    assert len(suite.validation) == 5 * get_preset("ci").suite.validation_per_category
    seen = {(r["instruction"], r["context"]) for r in suite.central + suite.public + suite.test + suite.pretrain}
    assert not seen & {(r["instruction"], r["context"]) for r in suite.validation}
    # Drawn last: the other sets are those of a suite without it.
    without = build_suite(dataclasses.replace(get_preset("ci").suite, validation_per_category=0))
    assert (without.test, without.pretrain, without.public) == (suite.test, suite.pretrain, suite.public)
    assert "validation.jsonl" not in without.files()


@pytest.mark.slow
def test_fedprox_mu_table_end_to_end_at_smoke_size(tmp_path: Path) -> None:
    """One table preset as a user runs it: pretrain, quality, results JSON, Markdown with the
    grid and the selected point, paired claims, plots, and the commit named."""
    common = ["--out", str(tmp_path), "--preset", "fedprox-mu", "--smoke", "--threads", "1"]
    assert main(["bench", "pretrain", *common]) == 0
    # Pretraining is cached by spec hash: the second call keeps the models.
    before = (tmp_path / "models" / "large" / "model.safetensors").stat().st_mtime_ns
    assert main(["bench", "pretrain", *common]) == 0
    assert (tmp_path / "models" / "large" / "model.safetensors").stat().st_mtime_ns == before
    assert main(["bench", "quality", *common]) == 0
    results = json.loads((tmp_path / "quality" / "results.json").read_text())
    assert results["commit"] and results["preset"] == "fedprox-mu --smoke"
    grid = results["selection"]["fedprox"]["grid"]
    assert [p["label"] for p in grid] == [f"fedprox@mu={m}" for m in ("0.001", "0.01", "0.1", "1")]
    chosen = [r for r in results["runs"] if r["method"] == "fedprox"]
    assert {r["seed"] for r in chosen} == {0, 1}
    assert all(r["selected"] == results["selection"]["fedprox"]["selected"] for r in chosen)
    (claim,) = [c for c in results["claims"] if c["claim"] == "fedprox > fedavg"]
    assert claim["n"] == 2 and claim["low"] <= claim["difference"] <= claim["high"]
    markdown = (tmp_path / "quality" / "results.md").read_text()
    assert "**selected**" in markdown and "95% interval" in markdown
    assert (tmp_path / "quality" / "plots" / "em.png").is_file()
