"""``fedtune bench quality`` end to end on the CI preset, plus its error paths."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from fedtune.benchmarks.presets import get_preset
from fedtune.benchmarks.quality import QualitySpec, run_quality
from fedtune.benchmarks.report import is_png
from fedtune.benchmarks.workspace import Workspace
from fedtune.cli.main import main
from fedtune.core.errors import ConfigError


def test_quality_bench_writes_results_table_and_plots(ci_workspace: Path) -> None:
    assert main(["bench", "quality", "--out", str(ci_workspace), "--preset", "ci"]) == 0
    out_dir = ci_workspace / "quality"
    results = json.loads((out_dir / "results.json").read_text())
    methods = [row["method"] for row in results["table"]]
    assert methods == ["zero-shot", "fedavg", "scaffold", "standalone", "centralized"]
    runs = {run["method"]: run for run in results["runs"]}
    for name in ("fedavg", "scaffold", "standalone", "centralized"):
        assert [r["round"] for r in runs[name]["rounds"]] == [0, 1, 2]
        # Round 0 is the untrained base model for every method.
        assert runs[name]["rounds"][0]["em"] == pytest.approx(runs["zero-shot"]["rounds"][0]["em"])
        assert runs[name]["rounds"][0]["test_loss"] == pytest.approx(
            runs["zero-shot"]["rounds"][0]["test_loss"], rel=1e-6
        )
        assert runs[name]["rounds"][2]["test_loss"] != runs[name]["rounds"][0]["test_loss"]
    # SCAFFOLD's first round with zero control variates is FedAvg on equal-sized tenants (the
    # CI suite's pathological shards), and round 2 differs once the control variates are
    # non-zero: the bench runs the real algorithms.
    fedavg, scaffold = runs["fedavg"]["rounds"], runs["scaffold"]["rounds"]
    assert scaffold[1]["test_loss"] == pytest.approx(fedavg[1]["test_loss"], rel=1e-5)
    assert scaffold[2]["test_loss"] != pytest.approx(fedavg[2]["test_loss"], rel=1e-7)
    claims = {c["claim"]: c for c in results["claims"]}
    assert {"fedavg > standalone", "scaffold > fedavg", "centralized >= fedavg"} <= set(claims)
    markdown = (out_dir / "results.md").read_text()
    assert "| scaffold | 1 |" in markdown and "paper ordering" in markdown
    plots = sorted((out_dir / "plots").glob("*.png"))
    assert [p.name for p in plots] == ["em.png", "local_em.png", "test_loss.png", "train_loss.png"]
    assert all(is_png(p) for p in plots)


def test_unknown_algorithm_lists_the_registered_ones(
    ci_workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["bench", "quality", "--out", str(ci_workspace), "--preset", "ci", "--algorithms", "fedmagic"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "fedmagic" in err and "fedavg" in err


def test_bad_param_and_param_for_an_algorithm_not_run(
    ci_workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["bench", "quality", "--out", str(ci_workspace), "--preset", "ci"]
    assert main([*base, "--param", "fedprox-mu-0.1"]) == 2
    assert "ALGORITHM.FIELD=VALUE" in capsys.readouterr().err
    assert main([*base, "--param", "fedprox.mu=0.1"]) == 2
    assert "fedprox" in capsys.readouterr().err


def test_workspace_without_models_says_to_pretrain(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        run_quality(Workspace(tmp_path), QualitySpec(algorithms=("fedavg",), seeds=(0,)))
    assert "fedtune bench pretrain" in info.value.fix


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--baselines", "oracle"], "unknown baseline(s) ['oracle']"),
        (["--seeds", ""], "no seed given"),
        (["--threads", "0"], "--threads 0"),
    ],
)
def test_invalid_options_are_config_errors(
    ci_workspace: Path, capsys: pytest.CaptureFixture[str], extra: list[str], fragment: str
) -> None:
    code = main(["bench", "quality", "--out", str(ci_workspace), "--preset", "ci", *extra])
    assert code == 2
    assert fragment in capsys.readouterr().err


def test_fedpt_family_scores_the_proxy_and_the_small_model(ci_workspace: Path, tmp_path: Path) -> None:
    """FedPT's comparison: the proxy-tuned large model against FedAvg on the small model."""
    import shutil

    workspace = tmp_path / "ws"
    shutil.copytree(ci_workspace / "suite", workspace / "suite")
    shutil.copytree(ci_workspace / "models", workspace / "models")
    spec = dataclasses.replace(
        get_preset("ci").quality,
        algorithms=("fedpt", "fedavg-pt"),
        baselines=("zero-shot", "fedavg-small"),
        algorithm_params={"fedpt": {"kd_size": 8, "kd_batch_size": 4, "kd_steps": 2, "eval_every": 100}},
    )
    results = run_quality(Workspace(workspace), spec)
    runs = {run["method"]: run["rounds"] for run in results["runs"]}
    zero, small = runs["zero-shot"][0], runs["fedavg-small"]
    for method in ("fedpt", "fedavg-pt"):
        # Round 0: no tuning direction yet, so Eq. 3 is exactly the large model.
        assert runs[method][0]["test_loss"] == pytest.approx(zero["test_loss"], rel=1e-6)
        assert runs[method][0]["small/test_loss"] == pytest.approx(small[0]["test_loss"], rel=1e-6)
        assert runs[method][2]["test_loss"] != pytest.approx(zero["test_loss"], rel=1e-6)
        assert 0.0 <= runs[method][2]["rouge_l"] <= 1.0 and "dist4" in runs[method][2]
    # FedAvg+PT federates exactly what FedAvg on the small model does; FedPT's distillation
    # moves the small model away from it.
    for pt, plain in zip(runs["fedavg-pt"], small, strict=True):
        assert pt["small/test_loss"] == pytest.approx(plain["test_loss"], rel=1e-6)
    assert runs["fedpt"][2]["small/test_loss"] != pytest.approx(small[2]["test_loss"], rel=1e-6)
    claims = {c["claim"] for c in results["claims"]}
    assert {"fedpt > fedavg-small", "fedpt > fedavg-pt", "fedavg-pt > fedavg-small"} <= claims
    from fedtune.benchmarks.report import quality_markdown

    assert "small-model EM" in quality_markdown(results)


def _part(seed: int, em: float) -> dict[str, Any]:
    """A results document of one seed: Zero-Shot (deterministic) and one method."""
    def run(method: str, kind: str, run_seed: int | None, value: float) -> dict[str, Any]:
        rows = [{"round": 0.0, "em": 0.1, "test_loss": 1.0}, {"round": 2.0, "em": value, "test_loss": 0.9}]
        return {"method": method, "kind": kind, "seed": run_seed, "seconds": 1.0, "rounds": rows}

    return {
        "spec": {"seeds": [seed], "rounds": 2}, "suite": {"test": {"records": 10}}, "split": {},
        "base_model": "m", "categories": [], "provenance": {"measured_at_commit": "abc"},
        "runs": [run("zero-shot", "baseline", None, 0.1), run("fedmkt", "algorithm", seed, em)],
    }


def test_results_split_by_seed_merge_into_one_table() -> None:
    from fedtune.benchmarks.quality import merge_results

    merged = merge_results([_part(0, 0.2), _part(1, 0.4)])
    assert merged["spec"]["seeds"] == [0, 1]
    assert [(r["method"], r["seed"]) for r in merged["runs"]] == [("zero-shot", None), ("fedmkt", 0), ("fedmkt", 1)]
    rows = {row["method"]: row for row in merged["table"]}
    assert rows["fedmkt"]["metrics"]["em"]["n"] == 2 and rows["fedmkt"]["metrics"]["em"]["mean"] == pytest.approx(0.3)
    assert rows["zero-shot"]["metrics"]["em"]["n"] == 1
    with pytest.raises(ConfigError, match="share seeds"):
        merge_results([_part(0, 0.2), _part(0, 0.4)])
    other = _part(1, 0.4) | {"provenance": {"measured_at_commit": "def"}}
    with pytest.raises(ConfigError, match=r"differ in \['provenance'\]"):
        merge_results([_part(0, 0.2), other])
