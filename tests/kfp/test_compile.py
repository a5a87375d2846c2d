"""Compiled pipelines: strictly valid, up to date, shaped as designed, and bounded in size."""

from __future__ import annotations

import argparse
import json
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
from fedtune.pipelines.builder import DEFAULT_CLUSTER, ClusterSettings, compile_pipeline
from fedtune.pipelines.compiling import compile_job
from fedtune.pipelines.run_form import FAMILIES
from fedtune.pipelines.validate import validate_compiled
from tests.kfp.conftest import cluster_job_dict, two_tenant_job

ROOT = catalog.repo_root()
COMMITTED = sorted((ROOT / "pipelines" / "compiled").glob("*.yaml"))
COMPONENT_SPECS = sorted((ROOT / "components").glob("*/component.yaml"))


def test_committed_compiled_files_are_up_to_date() -> None:
    stale = catalog.stale(ROOT)
    assert stale == [], f"run `python -m fedtune.pipelines.catalog --write`; stale: {stale}"


def test_one_committed_pipeline_per_family_and_ten_components() -> None:
    stems = sorted(p.stem for p in COMMITTED)
    jobs = sorted(p.stem for p in (ROOT / "pipelines" / "jobs").glob("*.yaml"))
    assert jobs == sorted([*FAMILIES, "fedit-secure"])  # and FedIT's secure-aggregation variant
    assert stems == sorted([*jobs, *(f"{j}-gpu" for j in jobs)])  # each with its GPU variant
    assert len(COMPONENT_SPECS) == 10


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
    """Every task of the pipeline: the root DAG's and every sub-DAG's (loops, conditions,
    the nested round pipeline)."""
    out = [(n, t) for n, t in spec["root"]["dag"]["tasks"].items()]
    for comp in spec["components"].values():
        out += list((comp.get("dag") or {}).get("tasks", {}).items())
    return out


def loop_over(spec: dict[str, Any], output: str) -> dict[str, Any]:
    """The ParallelFor task whose items are the task output ``output``."""
    (loop,) = [
        t
        for _, t in all_tasks(spec)
        if t.get("parameterIterator", {}).get("items", {}).get("inputParameter", "").endswith(output)
    ]
    return loop


def test_rounds_are_a_sequential_runtime_loop_and_tenants_a_runtime_fan_out(
    tmp_path: Path,
) -> None:
    spec = compiled(tmp_path, rounds=3)["spec"]
    assert loop_over(spec, "server-init-Output")["iteratorPolicy"] == {"parallelismLimit": 1}
    assert "iteratorPolicy" not in loop_over(spec, "configure-round-Output")  # in parallel
    # Nothing about the job's rounds or tenants is a constant of the graph.
    graph = yaml.safe_dump(spec["root"]["dag"]) + yaml.safe_dump(spec["components"])
    assert "tenant-a" not in graph and "tenant-b" not in graph


def test_the_compiled_yaml_is_the_same_for_2_and_200_rounds_and_any_tenants(
    tmp_path: Path,
) -> None:
    texts = set()
    for rounds, tenants in ((2, "ab"), (200, "abc")):
        job = parse_job(
            cluster_job_dict(
                rounds=rounds,
                tenants=[
                    {"name": f"t-{x}", "data_uri": f"s3://d/{x}.jsonl", "store_uri": f"s3://d/{x}"}
                    for x in tenants
                ],
            )
        )
        path, family = compile_job(job, tmp_path / f"{rounds}.yaml")
        assert family == "fedit"
        family_file = compile_pipeline(family, tmp_path / f"family-{rounds}.yaml", DEFAULT_CLUSTER)
        texts.add(family_file.read_text())
        # With the job as the run form's default, that default is all that differs.
        docs = list(yaml.safe_load_all(path.read_text()))
        form = docs[0]["root"]["inputDefinitions"]["parameters"]["job_config"]
        assert json.loads(form.pop("defaultValue"))["rounds"] == rounds
        family_docs = list(yaml.safe_load_all(family_file.read_text()))
        family_docs[0]["root"]["inputDefinitions"]["parameters"]["job_config"].pop("defaultValue")
        assert docs == family_docs
    assert len(texts) == 1


def test_every_task_including_sub_dags_is_uncached(tmp_path: Path) -> None:
    spec = compiled(tmp_path)["spec"]
    tasks = all_tasks(spec)
    sub_dags = [n for n, t in tasks if spec["components"][t["componentRef"]["name"]].get("dag")]
    assert any(n.startswith("fedtune-round") for n in sub_dags)  # the nested round pipeline
    assert any(n.startswith("condition") for n in sub_dags) and any(
        n.startswith("for-loop") for n in sub_dags
    )
    for name, task in tasks:
        caching = task.get("cachingOptions")
        if name.startswith(("for-loop", "condition")):
            # Loops and conditions are not executed: KFP has nothing to cache for them.
            assert not (caching or {}).get("enableCache"), name
            continue
        assert caching is not None and not caching.get("enableCache"), name


def test_models_metrics_and_the_round_table_are_typed_artifacts(tmp_path: Path) -> None:
    spec = compiled(tmp_path)["spec"]

    def outputs(component: str) -> dict[str, str]:
        arts = spec["components"][f"comp-{component}"]["outputDefinitions"]["artifacts"]
        return {k: v["artifactType"]["schemaTitle"] for k, v in arts.items()}

    assert outputs("export-and-register") == {
        "model": "system.Model",
        "companion": "system.Model",
        "final_metrics": "system.Metrics",
        "artifacts": "system.Artifact",
    }
    assert outputs("aggregate")["metrics"] == "system.Metrics"
    assert outputs("evaluate")["metrics"] == "system.Metrics"
    assert outputs("close-rounds")["rounds_table"] == "system.Markdown"
    assert outputs("close-rounds")["metrics"] == "system.Metrics"


FORM = {
    "job_uri": "STRING",
    "job_config": "STRING",
    "rounds": "NUMBER_INTEGER",
    "clients_per_round": "NUMBER_INTEGER",
    "lr": "NUMBER_DOUBLE",
    "local_steps": "NUMBER_INTEGER",
    "seed": "NUMBER_INTEGER",
    "run_label": "STRING",
    "resume_run_id": "STRING",
    "stop_after_round": "NUMBER_INTEGER",
}


def test_the_run_form_has_typed_described_parameters(tmp_path: Path) -> None:
    spec = compiled(tmp_path)["spec"]
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert {k: v["parameterType"] for k, v in params.items()} == FORM
    for name, param in params.items():
        assert len(param.get("description", "")) > 20, name
        assert param.get("isOptional") is True, name  # every field has a default
    description = spec["pipelineInfo"]["description"]
    assert "creating a run again trains again" in description
    assert f"fedit family ({', '.join(FAMILIES['fedit'])})" in description
    # The run's id reaches server init: state is scoped to the run by default.
    init = spec["root"]["dag"]["tasks"]["server-init"]["inputs"]["parameters"]
    assert init["kfp_run_id"]["runtimeValue"]["constant"] == "{{$.pipeline_job_uuid}}"


def test_tenant_steps_retry_and_provider_steps_do_not(tmp_path: Path) -> None:
    spec = compiled(tmp_path)["spec"]
    executed = {
        n: t
        for n, t in all_tasks(spec)
        if spec["components"][t["componentRef"]["name"]].get("executorLabel")
    }
    assert set(executed) == {
        "server-init", "configure-round", "client-step", "aggregate", "close-rounds",
        "final-broadcast", "evaluate", "export-and-register", "audit", "record-audit",
    }
    for name, task in executed.items():
        retries = task.get("retryPolicy", {}).get("maxRetryCount", 0)
        assert retries == (2 if name in ("client-step", "evaluate", "audit") else 0), name


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


def test_the_job_config_parameter_defaults_to_the_compiled_job(tmp_path: Path) -> None:
    spec = compiled(tmp_path)["spec"]
    param = spec["root"]["inputDefinitions"]["parameters"]["job_config"]
    assert "job as JSON" in param["description"]
    assert parse_job(yaml.safe_load(param["defaultValue"])).name == "fedit"


def test_kfp_local_form_has_no_platform_spec(tmp_path: Path) -> None:
    assert compiled(tmp_path, settings=None)["platform"] is None


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


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.stem)
def test_the_provider_publishes_the_final_broadcast_once_before_every_evaluate_task(
    path: Path,
) -> None:
    """Every family and secure variant: one provider task publishes; evaluate only reads."""
    spec = yaml.safe_load_all(path.read_text()).__next__()
    tasks = all_tasks(spec)
    (final,) = [t for n, t in tasks if t["componentRef"]["name"] == "comp-final-broadcast"]
    assert "retryPolicy" not in final and final["inputs"]["artifacts"]["state"] == {
        "componentInputArtifact": "pipelinechannel--close-rounds-state"
    }
    (evaluate,) = [t for n, t in tasks if n == "evaluate"]
    assert evaluate["inputs"]["artifacts"]["state"] == {
        "componentInputArtifact": "pipelinechannel--final-broadcast-broadcast"
    }
    (loop,) = [t for _, t in tasks if "final-broadcast" in t.get("dependentTasks", [])]
    assert loop["inputs"]["artifacts"]["pipelinechannel--final-broadcast-broadcast"] == {
        "taskOutputArtifact": {"outputArtifactKey": "broadcast", "producerTask": "final-broadcast"}
    }
    assert loop["componentRef"]["name"] in {
        n for n, c in spec["components"].items() if "evaluate" in c.get("dag", {}).get("tasks", {})
    }


def test_the_audit_runs_after_export_under_runtime_conditions(tmp_path: Path) -> None:
    out = compiled(tmp_path)
    spec = out["spec"]
    conditions = [
        t["triggerPolicy"]["condition"] for _, t in all_tasks(spec) if "triggerPolicy" in t
    ]
    assert any("close-rounds-Output" in c for c in conditions)  # job complete
    assert any("export-and-register-Output" in c for c in conditions)  # audit on
    assert "iteratorPolicy" not in loop_over(spec, "export-and-register-audited")
    executors = out["platform"]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert [m["configMapName"] for m in executors["exec-audit"]["configMapAsVolume"]] == [
        "fedtune-tenants"
    ]
    assert "configMapAsVolume" not in executors["exec-record-audit"]


SECURE_JOB = {"secure_aggregation": {"enabled": True}}
SECURE_TENANT_TASKS = {"secagg-tenant", "secagg-tenant-2", "secagg-tenant-3", "client-step"}


def test_a_secure_job_compiles_the_secure_variant_the_same_for_2_and_200_rounds(
    tmp_path: Path,
) -> None:
    docs = []
    for rounds, tenants in ((2, "ab"), (200, "abc")):
        job = parse_job(
            cluster_job_dict(
                rounds=rounds,
                secure_aggregation={"enabled": True, "threshold": 2},
                tenants=[
                    {"name": f"t-{x}", "data_uri": f"s3://d/{x}.jsonl", "store_uri": f"s3://d/{x}"}
                    for x in tenants
                ],
            )
        )
        path, family = compile_job(job, tmp_path / f"{rounds}.yaml")
        spec = list(yaml.safe_load_all(path.read_text()))
        spec[0]["root"]["inputDefinitions"]["parameters"]["job_config"].pop("defaultValue")
        docs.append(spec)
    assert docs[0] == docs[1]
    assert docs[0][0]["pipelineInfo"]["name"] == "fedtune-fedit-secure"
    plain = yaml.safe_load(compile_pipeline("fedit", tmp_path / "plain.yaml", None).read_text())
    assert plain["pipelineInfo"]["name"] == "fedtune-fedit" and "comp-secure-aggregate" not in plain["components"]


def test_the_secure_round_runs_every_phase_uncached_and_tenant_phases_through_the_launcher(
    tmp_path: Path,
) -> None:
    out = compiled(tmp_path, ClusterSettings(store_secret="s3-creds"), **SECURE_JOB)
    spec = out["spec"]
    tasks = all_tasks(spec)
    executed = {
        n: t for n, t in tasks if spec["components"][t["componentRef"]["name"]].get("executorLabel")
    }
    assert set(executed) >= {
        "configure-round", "secagg-tenant", "secagg-provider", "secagg-tenant-2",
        "secagg-provider-2", "client-step", "secagg-provider-3", "secagg-tenant-3",
        "secure-aggregate",
    }
    assert "aggregate" not in executed  # the plain aggregation is not in the secure variant
    phases = {
        t["inputs"]["parameters"][key]["runtimeValue"]["constant"]
        for _, t in executed.items()
        for key in ("phase", "step")
        if key in t.get("inputs", {}).get("parameters", {})
    }
    assert phases == {
        "secagg-advertise", "secagg-share", "secagg-unmask",
        "route-keys", "route-shares", "request-unmask",
    }
    for name, task in tasks:
        caching = task.get("cachingOptions")
        if not name.startswith(("for-loop", "condition")):
            assert caching is not None and not caching.get("enableCache"), name
    executors = out["platform"]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for name, task in executed.items():
        retries = task.get("retryPolicy", {}).get("maxRetryCount", 0)
        launcher = name in SECURE_TENANT_TASKS or name in ("evaluate", "audit")
        assert retries == (2 if launcher else 0), name
        mounts = executors[f"exec-{name}"].get("configMapAsVolume", [])
        assert [m["configMapName"] for m in mounts] == (["fedtune-tenants"] if launcher else []), name
    # Each tenant fan-out is a runtime loop over the tenants still in the round.
    for provider in ("configure-round", "secagg-provider", "secagg-provider-2", "secagg-provider-3"):
        assert "iteratorPolicy" not in loop_over(spec, f"{provider}-Output")


def test_every_family_is_in_the_family_tables_of_the_docs() -> None:
    """Each registered family has a row, with its pipeline names, in both tables users read."""
    for doc in (ROOT / "README.md", ROOT / "pipelines" / "README.md"):
        rows = [line for line in doc.read_text().splitlines() if line.lstrip().startswith("| ")]
        for family, algorithms in FAMILIES.items():
            row = next((r for r in rows if f"`fedtune-{family}`" in r), None)
            assert row is not None, f"{doc.name}: no row names the pipeline fedtune-{family}"
            assert all(a in row for a in algorithms), (doc.name, family, row)
    shipped = (ROOT / "pipelines" / "README.md").read_text()
    assert all(f"`fedtune-{family}-gpu`" in shipped for family in FAMILIES)
