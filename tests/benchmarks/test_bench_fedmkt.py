"""FedMKT's comparison in ``fedtune bench quality`` end to end on the CI preset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedtune.cli.main import main


def test_fedmkt_comparison_scores_the_llm_and_every_tenants_small_model(ci_workspace: Path) -> None:
    args = ["bench", "quality", "--out", str(ci_workspace), "--preset", "ci", "--comparison", "fedmkt"]
    assert main(args) == 0
    results = json.loads((ci_workspace / "quality" / "results.json").read_text())
    rows = {row["method"]: row["metrics"] for row in results["table"]}
    assert set(rows) == {
        "zero-shot", "fedmkt", "fedmkt@fedavg_small=true", "fedmkt@llm_frozen=true", "standalone-small",
        "centralized", "fedavg-small",
    }
    tenants = sorted(results["split"]["tenants"])
    for method in ("zero-shot", "fedmkt", "fedmkt@llm_frozen=true", "standalone-small", "fedavg-small"):
        assert {f"slm/em/{t}" for t in tenants} | {"slm/em", "slm/local_em"} <= set(rows[method])
    for method in ("zero-shot", "fedmkt", "fedmkt@llm_frozen=true", "centralized"):
        assert "llm/em" in rows[method]
    assert "slm/em" not in rows["centralized"]
    runs = {(r["method"], r["seed"]): r for r in results["runs"]}
    frozen = runs[("fedmkt@llm_frozen=true", 0)]["rounds"]
    # LLM2SLM never trains the LLM: every round scores the zero-shot LLM.
    zero = runs[("zero-shot", None)]["rounds"][-1]
    assert frozen[-1]["test_loss"] == pytest.approx(zero["test_loss"], rel=1e-6)
    assert runs[("fedmkt", 0)]["rounds"][-1]["test_loss"] != pytest.approx(zero["test_loss"], rel=1e-6)
    claims = {c["claim"] for c in results["claims"]}
    assert {
        "slm/em: fedmkt > standalone-small", "slm/em: fedmkt > fedavg-small",
        "slm/em: fedmkt > fedmkt@llm_frozen=true", "llm/em: fedmkt >= centralized - 0.05",
        "slm/em: fedmkt@fedavg_small=true > fedavg-small",
    } <= claims
    # The public set is drawn from the tenants' distribution (the paper's split), recorded
    # with the results, and the LLM-side premise reads it.
    public = results["suite"]["public"]
    assert public["drawn_from"] == "tenant_mixture" and public["category_counts"]["count"] > 0
    drawn = ci_workspace / "suite" / "tenant-public" / "public.jsonl"
    assert sum(public["category_counts"].values()) == len(drawn.read_text().splitlines())
    markdown = (ci_workspace / "quality" / "results.md").read_text()
    assert "Premise (tenants know what the LLM does not, on public data)" in markdown
    assert "| fedmkt@llm_frozen=true |" in markdown and "SLM EM tenant-1" in markdown
    # Whether what the LLM knows reaches the SLMs: their mean EM per category.
    assert "Per category: the SLMs' mean EM" in markdown


def test_fedmkt_comparison_refuses_the_fewshot_split(ci_workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main([
        "bench", "quality", "--out", str(ci_workspace), "--preset", "ci",
        "--comparison", "fedmkt", "--split", "fewshot",
    ])
    err = capsys.readouterr().err
    assert code == 2
    assert "--comparison fedmkt" in err and "fewshot" in err and "Drop" in err


def test_heterogeneous_comparison_gives_each_tenant_its_own_architecture_and_tokenizer(
    ci_workspace: Path,
) -> None:
    out = ci_workspace / "hetero"
    if not out.exists():
        # Its own workspace copy, so the homogeneous test's results stay where they are.
        import shutil

        shutil.copytree(ci_workspace, out, ignore=shutil.ignore_patterns("quality", "hetero"))
    args = ["bench", "quality", "--out", str(out), "--preset", "ci", "--comparison", "fedmkt-hetero"]
    assert main(args) == 0
    results = json.loads((out / "quality" / "results.json").read_text())
    models = results["tenant_models"]
    tenants = sorted(results["split"]["tenants"])
    assert sorted(models) == tenants
    # Every tenant a different model: two architectures, three tokenizer families.
    assert {m["arch"] for m in models.values()} == {"llama", "gpt2"}
    assert len({m["tokenizer"] for m in models.values()}) == len(tenants)
    assert len({m["vocab_size"] for m in models.values()}) == len(tenants)
    rows = {row["method"]: row["metrics"] for row in results["table"]}
    # FedAvg averages parameters: undefined across these models, so it does not run.
    assert set(rows) == {"zero-shot", "fedmkt", "fedmkt@llm_frozen=true", "standalone-small", "centralized"}
    for method in ("zero-shot", "fedmkt", "fedmkt@llm_frozen=true", "standalone-small"):
        assert {f"slm/em/{t}" for t in tenants} | {"slm/em", "slm/local_em"} <= set(rows[method])
    assert results["provenance"]["command"].startswith("fedtune bench quality")
    runs = {(r["method"], r["seed"]): r for r in results["runs"]}
    # The tenants' SLMs trained: each one's final test loss moved off its zero-shot one.
    fedmkt_final = runs[("fedmkt", 0)]["rounds"][-1]
    zero = runs[("zero-shot", None)]["rounds"][-1]
    assert fedmkt_final["slm/test_loss"] != pytest.approx(zero["slm/test_loss"], rel=1e-6)
    markdown = (out / "quality" / "results.md").read_text()
    assert "Each tenant's own small model" in markdown
    for tenant, model in models.items():
        assert f"| {tenant} | {model['model']} | {model['arch']} |" in markdown


def test_heterogeneous_comparison_refuses_fedavg_of_the_small_models(
    ci_workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([
        "bench", "quality", "--out", str(ci_workspace), "--preset", "ci",
        "--comparison", "fedmkt-hetero", "--baselines", "fedavg-small",
        "--algorithms", "fedmkt,fedmkt@fedavg_small=true",
    ])
    err = capsys.readouterr().err
    assert code == 2
    assert "['fedavg-small', 'fedmkt@fedavg_small=true']" in err and "undefined" in err
