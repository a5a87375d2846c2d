"""Compiled pipelines: strictly valid, up to date, shaped as designed, and bounded in size."""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedtune import __version__
from fedtune.cli.kfp_commands import register_compile
from fedtune.cli.submit import register_submit
from fedtune.config import parse_job
from fedtune.core.errors import ConfigError, FedtuneError
from fedtune.pipelines import catalog
from fedtune.pipelines.builder import DEFAULT_CLUSTER, ClusterSettings
from fedtune.pipelines.compiling import compile_job
from fedtune.pipelines.plan import MAX_TASKS, plan_job
from fedtune.pipelines.validate import validate_compiled
from tests.kfp.conftest import cluster_job_dict, two_tenant_job

ROOT = catalog.repo_root()
COMMITTED = sorted((ROOT / "pipelines" / "compiled").glob("*.yaml"))
COMPONENT_SPECS = sorted((ROOT / "components").glob("*/component.yaml"))


def test_committed_compiled_files_are_up_to_date() -> None:
    stale = catalog.stale(ROOT)
    assert stale == [], f"run `python -m fedtune.pipelines.catalog --write`; stale: {stale}"


def test_one_committed_pipeline_per_available_family_and_eight_components() -> None:
    assert [p.stem for p in COMMITTED] == sorted(
        p.stem for p in (ROOT / "pipelines" / "jobs").glob("*.yaml")
    )
    assert "fedit" in [p.stem for p in COMMITTED]
    assert len(COMPONENT_SPECS) == 8


@pytest.mark.parametrize(
    "path", COMMITTED + COMPONENT_SPECS, ids=lambda p: p.parent.name + "/" + p.name
)
def test_every_compiled_file_parses_strictly_and_loads_back(path: Path) -> None:
    parsed = validate_compiled(path)
    assert parsed["pipeline_spec"].pipeline_info.name
    if path in COMMITTED:
        assert parsed["platform_spec"] is not None  # the cluster settings


def test_the_strict_parse_rejects_an_unknown_field(tmp_path: Path) -> None:
    text = (
        COMMITTED[0]
        .read_text()
        .replace("schemaVersion: 2.1.0", "schemaVersion: 2.1.0\nbogus: 1", 1)
    )
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(ConfigError, match="bogus"):
        validate_compiled(tmp_path / "bad.yaml")


def compiled(
    tmp_path: Path, settings: ClusterSettings | None = DEFAULT_CLUSTER, **job: Any
) -> dict[str, Any]:
    path, _ = compile_job(
        parse_job(cluster_job_dict(**job)), tmp_path / "p.yaml", settings=settings
    )
    docs = list(yaml.safe_load_all(path.read_text()))
    return {
        "spec": docs[0],
        "platform": docs[1] if len(docs) > 1 else None,
        "text": path.read_text(),
    }


def all_tasks(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = [(n, t) for n, t in spec["root"]["dag"]["tasks"].items()]
    for comp in spec["components"].values():
        out += list((comp.get("dag") or {}).get("tasks", {}).items())
    return out


def test_rounds_are_unrolled_and_tenants_are_a_parallel_for(tmp_path: Path) -> None:
    spec = compiled(tmp_path, rounds=3)["spec"]
    root = spec["root"]["dag"]["tasks"]
    rounds = sorted(n for n in root if n.startswith("fedtune-round"))
    assert rounds == ["fedtune-round", "fedtune-round-2", "fedtune-round-3"]
    assert [root[n]["taskInfo"]["name"] for n in rounds] == ["round 1", "round 2", "round 3"]
    for name in rounds:
        inputs = root[name]["inputs"]["parameters"]
        assert inputs["tenants"]["runtimeValue"]["constant"] == ["tenant-a", "tenant-b"]
    loops = [t for _, t in all_tasks(spec) if "parameterIterator" in t]
    assert len(loops) == 3 + 1  # one per round, one for the final evaluation
    assert {"server-init", "export-and-register"} <= set(root)


def test_side_effecting_steps_are_uncached_and_tenant_steps_retry(tmp_path: Path) -> None:
    spec = compiled(tmp_path)["spec"]
    executed = [
        (n, t)
        for n, t in all_tasks(spec)
        if spec["components"][t["componentRef"]["name"]].get("executorLabel")
    ]
    assert {n for n, _ in executed} == {
        "server-init",
        "configure-round",
        "client-step",
        "aggregate",
        "evaluate",
        "export-and-register",
    }
    for name, task in executed:
        assert not task["cachingOptions"].get("enableCache"), name
        retries = task.get("retryPolicy", {}).get("maxRetryCount", 0)
        assert retries == (2 if name in ("client-step", "evaluate") else 0), name


def test_images_carry_the_package_version_and_nothing_is_installed(tmp_path: Path) -> None:
    spec = compiled(tmp_path)["spec"]
    for executor in spec["deploymentSpec"]["executors"].values():
        container = executor["container"]
        assert container["image"] == f"ghcr.io/fedtune/fedtune-cpu:{__version__}"
        assert "pip install" not in " ".join(container["command"])


def test_cluster_settings_reach_the_right_tasks_and_no_secret_value_is_compiled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "super-secret-provider-key")
    out = compiled(
        tmp_path, ClusterSettings(store_secret="s3-creds", s3_endpoint="http://minio:9000")
    )
    executors = out["platform"]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for name, config in executors.items():
        assert config["secretAsEnv"][0]["secretName"] == "s3-creds", name
        launcher = name.startswith(("exec-client-step", "exec-evaluate", "exec-audit"))
        mounts = config.get("configMapAsVolume", [])
        assert [m["configMapName"] for m in mounts] == (["fedtune-tenants"] if launcher else []), (
            name
        )
    assert "super-secret-provider-key" not in out["text"]
    env = {
        e["name"]: e["value"]
        for ex in out["spec"]["deploymentSpec"]["executors"].values()
        for e in ex["container"].get("env", [])
    }
    assert env["FEDTUNE_S3_ENDPOINT_URL"] == "http://minio:9000"
    assert env["FEDTUNE_TENANTS_FILE"] == "/etc/fedtune/tenants.json"


def test_the_job_config_parameter_is_described_for_the_ui_form(tmp_path: Path) -> None:
    spec = compiled(tmp_path)["spec"]
    param = spec["root"]["inputDefinitions"]["parameters"]["job_config"]
    assert "job config as JSON" in param["description"]
    assert parse_job(yaml.safe_load(param["defaultValue"])).name == "fedit"
    assert "rounds 1-2 of 2" in spec["pipelineInfo"]["description"]


def test_kfp_local_form_has_no_platform_spec(tmp_path: Path) -> None:
    assert compiled(tmp_path, settings=None)["platform"] is None


# -- size bound ------------------------------------------------------------------------------
def test_task_count_follows_the_documented_rule(tmp_path: Path) -> None:
    plan = plan_job(two_tenant_job(tmp_path, rounds=2))
    # init + 2 x (round, configure, loop, 2 x (iteration, client), aggregate) + loop + 2 x 2 + export
    assert plan.task_count() == 1 + 2 * (4 + 4) + (2 + 4)
    assert plan_job(two_tenant_job(tmp_path, rounds=2), rounds=1).task_count() == 1 + 8


def test_a_job_too_large_for_one_run_is_refused_with_a_split_that_fits(tmp_path: Path) -> None:
    job = parse_job(cluster_job_dict(rounds=20))
    with pytest.raises(ConfigError, match=rf"above the bound of {MAX_TASKS}") as info:
        compile_job(job, tmp_path / "p.yaml")
    fix = info.value.fix
    match = re.search(r"--start-round 1 --rounds (\d+)", fix)
    assert match and "resumes from the server state" in fix
    k = int(match.group(1))
    compile_job(job, tmp_path / "first.yaml", rounds=k)  # the advice works
    with pytest.raises(ConfigError):
        compile_job(job, tmp_path / "more.yaml", rounds=k + 1)
    compile_job(job, tmp_path / "last.yaml", start_round=20 - 2, rounds=3)
    assert not (tmp_path / "p.yaml").exists()


def test_too_many_tenants_for_even_one_round_says_to_sample_fewer(tmp_path: Path) -> None:
    tenants = [
        {"name": f"t{i}", "data_uri": f"s3://d/t{i}.jsonl", "store_uri": f"s3://d/s{i}"}
        for i in range(30)
    ]
    with pytest.raises(ConfigError, match="unrolls to") as info:
        compile_job(parse_job(cluster_job_dict(tenants=tenants, rounds=1)), tmp_path / "p.yaml")
    assert "clients_per_round" in info.value.fix


@pytest.mark.parametrize(
    ("start", "rounds", "message"),
    [
        (0, None, "--start-round 0 is outside"),
        (3, None, "--start-round 3 is outside"),
        (1, 5, "--rounds 5"),
    ],
)
def test_round_ranges_outside_the_job_are_refused(
    start: int, rounds: int | None, message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        plan_job(parse_job(cluster_job_dict()), start, rounds)


def test_a_laptop_job_cannot_be_compiled_for_a_cluster_and_every_problem_is_listed(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError) as info:
        compile_job(
            two_tenant_job(tmp_path / "w", tracking={"backend": "mlflow"}), tmp_path / "p.yaml"
        )
    text = str(info.value)
    assert "7 problem(s)" in text  # exchange, provider store, 2 data, 2 stores, tracking
    for needle in (
        "exchange_uri",
        "provider_store_uri",
        "tenant-a.data_uri",
        "tenant-b.store_uri",
        "tracking.tracking_uri",
    ):
        assert needle in text
    assert "kfp-local" in info.value.fix


# -- the CLI registrars ------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedtune")
    sub = p.add_subparsers(dest="command", required=True)
    register_compile(sub)
    register_submit(sub)
    return p


def test_fedtune_compile_writes_a_valid_pipeline(tmp_path: Path) -> None:
    args = parser().parse_args(
        [
            "compile",
            str(ROOT / "pipelines/jobs/fedit.yaml"),
            "-o",
            str(tmp_path / "out.yaml"),
            "--rounds",
            "2",
        ]
    )
    assert args.handler(args) == 0
    assert validate_compiled(tmp_path / "out.yaml")["platform_spec"] is not None


def test_fedtune_submit_without_a_reachable_host_fails_fast_and_clearly() -> None:
    args = parser().parse_args(
        ["submit", str(ROOT / "pipelines/jobs/fedit.yaml"), "--host", "http://127.0.0.1:9"]
    )
    started = time.perf_counter()
    with pytest.raises(FedtuneError) as info:
        args.handler(args)
    assert time.perf_counter() - started < 5.0
    assert "cannot reach Kubeflow Pipelines at http://127.0.0.1:9" in str(info.value)
    assert "refused" in str(info.value).lower()
    assert "port-forward" in info.value.fix


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--host", "127.0.0.1:8080"], "is not an http(s) URL"),
        (["--host", "http://h", "--namespace", "Team_A"], "'Team_A' is not a DNS-1123"),
    ],
    ids=["host-not-a-url", "non-dns-namespace"],
)
def test_fedtune_submit_refuses_bad_input(extra: list[str], message: str) -> None:
    args = parser().parse_args(["submit", str(ROOT / "pipelines/jobs/fedit.yaml"), *extra])
    with pytest.raises(ConfigError, match=re.escape(message)):
        args.handler(args)


def test_an_audited_job_audits_through_the_launcher_after_export(tmp_path: Path) -> None:
    out = compiled(tmp_path, audit={"enabled": True, "tenants": ["tenant-b"]})
    spec = out["spec"]
    tasks = dict(all_tasks(spec))
    assert tasks["audit"]["retryPolicy"]["maxRetryCount"] == 2
    assert "record-audit" in spec["root"]["dag"]["tasks"]
    loops = [t["parameterIterator"]["items"]["raw"] for _, t in all_tasks(spec)
             if "raw" in t.get("parameterIterator", {}).get("items", {})]
    assert loops[-2:] == ['["tenant-a", "tenant-b"]', '["tenant-b"]']  # evaluate, then audit
    executors = out["platform"]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert [m["configMapName"] for m in executors["exec-audit"]["configMapAsVolume"]] == [
        "fedtune-tenants"
    ]
    assert "configMapAsVolume" not in executors["exec-record-audit"]
    plan = plan_job(parse_job(cluster_job_dict(audit={"enabled": True})))
    assert plan.task_count() == plan_job(parse_job(cluster_job_dict())).task_count() + 2 + 2 * 2


def test_a_run_whose_audit_settings_differ_from_the_compiled_plan_is_refused() -> None:
    plan = plan_job(parse_job(cluster_job_dict(audit={"enabled": True})))
    problems = plan.mismatches(parse_job(cluster_job_dict()))
    assert problems and "memorization audit" in problems[0]
