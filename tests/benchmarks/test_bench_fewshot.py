"""FewFedPIT's comparison in ``fedtune bench quality``: the few-shot split, method variants
and the leakage column, end to end on the CI preset."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from fedtune.benchmarks.fewshot_split import FewShotSpec, ensure_fewshot_split
from fedtune.benchmarks.presets import FEWSHOT_METHODS, get_preset
from fedtune.benchmarks.suite import read_set
from fedtune.cli.main import main
from fedtune.core.errors import DataError


@pytest.fixture()
def workspace(ci_workspace: Path, tmp_path: Path) -> Path:
    """A private copy of the CI workspace (the split and results are written into it)."""
    root = tmp_path / "ws"
    shutil.copytree(ci_workspace / "suite", root / "suite")
    shutil.copytree(ci_workspace / "models", root / "models")
    return root


def test_fewshot_split_is_deterministic_and_checked(workspace: Path) -> None:
    spec = get_preset("ci").fewshot_quality.fewshot
    suite = workspace / "suite"
    folder, manifest = ensure_fewshot_split(suite, spec)
    assert folder == suite / "fewshot"
    assert sorted(manifest["tenants"]) == ["tenant-01", "tenant-02", "tenant-03", "tenant-04"]
    for name, digest in manifest["files"].items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest
    # Few records per tenant, all of them from the suite's private pool; central is their union.
    pool = {json.dumps(r, sort_keys=True) for r in read_set(suite, "central")}
    central = read_set(folder, "central")
    sizes = [t["records"] for t in manifest["tenants"].values()]
    assert len(central) == manifest["kept"] == sum(sizes)
    unlabelled = [{k: v for k, v in r.items() if k != "cluster"} for r in central]
    assert all(json.dumps(r, sort_keys=True) in pool for r in unlabelled)
    # Drawing it again (another folder) gives the same bytes.
    other = workspace / "again"
    shutil.copytree(suite, other, ignore=shutil.ignore_patterns("fewshot"))
    _, again = ensure_fewshot_split(other, spec)
    assert again["files"] == manifest["files"]
    # Other settings redraw it; a damaged file is an error that says what to do.
    _, bigger = ensure_fewshot_split(suite, FewShotSpec(tenants=3, clusters=5, per_cluster=6))
    assert sorted(bigger["tenants"]) == ["tenant-01", "tenant-02", "tenant-03"]
    (folder / "tenant-01.jsonl").write_text("{}\n")
    with pytest.raises(DataError) as info:
        ensure_fewshot_split(suite, FewShotSpec(tenants=3, clusters=5, per_cluster=6))
    assert "tenant-01.jsonl" in str(info.value) and "Delete" in info.value.fix


def test_fewshot_quality_reports_utility_and_leakage_for_every_method(workspace: Path) -> None:
    argv = ["bench", "quality", "--out", str(workspace), "--preset", "ci", "--split", "fewshot"]
    assert main([*argv, "--threads", "1"]) == 0
    results = json.loads((workspace / "quality" / "results.json").read_text())
    methods = [row["method"] for row in results["table"]]
    assert methods == ["zero-shot", *FEWSHOT_METHODS, "centralized"]
    for row in results["table"]:
        for metric in ("em", "rouge_l", "leakage", "leakage/reproduced"):
            assert 0.0 <= row["metrics"][metric]["mean"] <= 1.0, (row["method"], metric)
    finals = {run["method"]: run["rounds"][-1] for run in results["runs"]}
    # 2 of 4 tenants per round for 2 rounds; Centralized is one pooled tenant every round.
    assert finals["fedavg"]["clients/steps"] == 4 and finals["centralized"]["clients/steps"] == 2
    # FewFedPIT synthesised with beta < 1 and skipped it at beta = 1, which uploads FedAvg's.
    assert finals["fewfedpit@beta=0"]["clients/fewfedpit/instruction_prompts"] > 0
    assert "clients/fewfedpit/instruction_prompts" not in finals["fewfedpit@beta=1"]
    for key in ("test_loss", "em", "leakage"):
        assert finals["fewfedpit@beta=1"][key] == finals["fedavg"][key]
    claims = {c["claim"]: c for c in results["claims"]}
    assert claims["fewfedpit@beta=1 == fedavg"]["verdict"] == "reproduces"
    for beta in ("0", "0.5"):
        assert f"leakage: fewfedpit@beta={beta} < fedavg" in claims
    assert "fewfedpit@beta=0.5 >= centralized - 0.05" in claims
    assert results["split"]["name"] == "fewshot" and len(results["split"]["tenants"]) == 4
    markdown = (workspace / "quality" / "results.md").read_text()
    assert "| leakage | reproduced |" in markdown and "the fewshot split, 4 tenants" in markdown
    assert "| fewfedpit@beta=0.5 | 1 |" in markdown
    assert "| synthetic passed / kept |" in markdown
    # Per client step: what was generated, dropped by each filter, passed, kept and used.
    runs = {run["method"]: run for run in results["runs"]}
    assert "synthesis_steps" not in runs["fedavg"] and "synthesis_steps" not in runs["fewfedpit@beta=1"]
    for method in ("fewfedpit@beta=0", "fewfedpit@beta=0.5"):
        steps, final = runs[method]["synthesis_steps"], finals[method]
        assert 0 < len(steps) <= final["clients/steps"]
        for count, metric in (("generated", "instruction_prompts"), ("passed", "candidates")):
            assert sum(s[count] for s in steps) == final[f"clients/fewfedpit/{metric}"]
        assert sum(s["kept"] for s in steps) == final.get("clients/fewfedpit/kept", 0)
        assert all(0 <= s["used"] <= s["kept"] <= s["passed"] for s in steps)
        assert all(s["generated"] >= s["rejected_format"] + s["rejected_similar_instruction"] for s in steps)
        assert f"| {method} | {len(steps)} |" in markdown.split("Synthetic data per client step")[1]
    assert "steps using ≥ 1 |" in markdown


@pytest.mark.parametrize(
    ("methods", "fragment"),
    [
        ("fedavg,fewfedpit@beta", "setting 'beta' is not FIELD=VALUE"),
        ("@beta=0", "no algorithm name"),
        ("fewfedpit@beta=0@beta=1", "sets 'beta' twice"),
        ("fewfedpit@beta=2", "fewfedpit.beta"),
        ("fewfedpit@gamma=1", "gamma"),
        ("fedavg,fedavg", "listed more than once"),
        ("fedmagic@beta=0", "unknown algorithm(s) ['fedmagic']"),
    ],
)
def test_bad_method_variants_are_config_errors(
    ci_workspace: Path, capsys: pytest.CaptureFixture[str], methods: str, fragment: str
) -> None:
    argv = ["bench", "quality", "--out", str(ci_workspace), "--preset", "ci", "--split", "fewshot"]
    assert main([*argv, "--algorithms", methods]) == 2
    err = capsys.readouterr().err
    assert fragment in err, err


def test_more_clients_per_round_than_tenants_is_refused(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "quality", "--out", str(workspace), "--preset", "ci", "--split", "fewshot"]
    assert main([*argv, "--clients-per-round", "5"]) == 2
    err = capsys.readouterr().err
    assert "clients_per_round=5" in err and "4 tenants" in err
