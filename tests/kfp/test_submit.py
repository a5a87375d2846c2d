"""`fedtune submit` against a stand-in of the KFP REST API, through the real kfp.Client."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fedtune.cli.submit import COOKIE_ENV, TOKEN_ENV, register_submit
from fedtune.core.errors import ConfigError, FedtuneError
from tests.helpers.kfp_api import FakeKfp

ROOT = Path(__file__).resolve().parents[2]
JOB = str(ROOT / "pipelines" / "jobs" / "fedit.yaml")
TOKEN = "eyJ-a-bearer-token-that-must-never-be-printed"


@pytest.fixture
def kfp_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKfp]:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(COOKIE_ENV, raising=False)
    # kfp.Client reads its context file from $HOME; keep the developer's out of it.
    monkeypatch.setenv("HOME", "/nonexistent-home-for-kfp")
    server = FakeKfp().start()
    yield server
    server.stop()


def submit(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="fedtune")
    register_submit(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["submit", JOB, *argv])
    return int(args.handler(args))


def test_a_run_gets_typed_param_overrides_in_the_named_experiment(kfp_api: FakeKfp) -> None:
    job_config = json.dumps({"name": "override"})
    assert submit("--host", kfp_api.url, "--experiment", "nightly", "--param", f"job_config={job_config}",
                  "--param", "rounds=200", "--param", "lr=0.0005",
                  "--service-account", "ft-fedtune-launcher") == 0
    (experiment,) = kfp_api.experiments
    assert experiment["display_name"] == "nightly"
    (run,) = kfp_api.runs
    assert run["experiment_id"] == experiment["experiment_id"]
    # The run form's overrides arrive typed as the pipeline declares them.
    assert run["runtime_config"]["parameters"] == {"job_config": job_config, "rounds": 200, "lr": 0.0005}
    assert run["service_account"] == "ft-fedtune-launcher"
    # Sent with the run, caching off on every task.
    tasks = run["pipeline_spec"]["pipeline_spec"]["root"]["dag"]["tasks"]
    assert all(t["cachingOptions"] == {} or not t["cachingOptions"].get("enableCache") for t in tasks.values())
    # A second submission reuses the experiment.
    assert submit("--host", kfp_api.url, "--experiment", "nightly") == 0
    assert len(kfp_api.experiments) == 1 and len(kfp_api.runs) == 2


def test_each_submission_is_a_new_version_of_the_named_pipeline(kfp_api: FakeKfp) -> None:
    assert submit("--host", kfp_api.url, "--pipeline", "fedtune-fedit") == 0
    assert submit("--host", kfp_api.url, "--pipeline", "fedtune-fedit",
                  "--pipeline-version", "lr-sweep-2") == 0
    (pipeline,) = kfp_api.pipelines.values()
    assert pipeline["display_name"] == "fedtune-fedit"
    versions = kfp_api.versions[pipeline["pipeline_id"]]
    assert [v["display_name"] for v in versions] == ["fedtune-fedit", "lr-sweep-2"]
    uploaded = next(yaml.safe_load_all(kfp_api.uploads[versions[1]["pipeline_version_id"]]))
    assert "job_config" in uploaded["root"]["inputDefinitions"]["parameters"]
    # Each run names its version, not an inline spec.
    refs = [r["pipeline_version_reference"] for r in kfp_api.runs]
    assert [r["pipeline_version_id"] for r in refs] == [v["pipeline_version_id"] for v in versions]
    assert all(not r.get("pipeline_spec") for r in kfp_api.runs)


def test_a_pipeline_of_a_profile_namespace_is_found_again(kfp_api: FakeKfp) -> None:
    # A shared pipeline of that name exists (e.g. another team's chart install).
    assert submit("--host", kfp_api.url, "--pipeline", "fedtune-fedit") == 0
    for version in ("v1", "v2"):  # the second lookup must find the namespaced pipeline
        assert submit("--host", kfp_api.url, "--namespace", "team-a", "--pipeline",
                      "fedtune-fedit", "--pipeline-version", version) == 0
    (team,) = [p for p in kfp_api.pipelines.values() if p.get("namespace") == "team-a"]
    assert [v["display_name"] for v in kfp_api.versions[team["pipeline_id"]]] == ["fedtune-fedit", "v2"]
    assert len(kfp_api.pipelines) == 2


def test_cron_creates_a_recurring_run_of_the_uploaded_version(kfp_api: FakeKfp) -> None:
    assert submit("--host", kfp_api.url, "--pipeline", "fedtune-fedit", "--cron", "0 0 3 * * 1") == 0
    assert kfp_api.runs == []
    (recurring,) = kfp_api.recurring_runs
    assert recurring["trigger"]["cron_schedule"]["cron"] == "0 0 3 * * 1"
    assert recurring["mode"] == "ENABLE" and int(recurring["max_concurrency"]) == 1
    assert recurring["no_catchup"] is True
    (version,) = next(iter(kfp_api.versions.values()))
    assert recurring["pipeline_version_reference"]["pipeline_version_id"] == version["pipeline_version_id"]


@pytest.mark.parametrize(
    ("login", "env"),
    [("token", {TOKEN_ENV: TOKEN}), ("cookie", {COOKIE_ENV: "authservice_session=s3ss10n"})],
)
def test_behind_a_sign_in_gateway_the_login_comes_from_the_environment(
    kfp_api: FakeKfp,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    login: str,
    env: dict[str, str],
) -> None:
    kfp_api.token, kfp_api.cookie = TOKEN, "authservice_session=s3ss10n"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert submit("--host", kfp_api.url, "--pipeline", "p", "--cron", "0 0 3 * * *") == 0
    assert len(kfp_api.recurring_runs) == 1
    # Every API call carried it (none was redirected to the login page) ...
    assert {path for _, path, _ in kfp_api.requests} >= {
        "/apis/v2beta1/healthz", "/apis/v2beta1/pipelines/upload", "/apis/v2beta1/recurringruns"
    }
    printed = capsys.readouterr()
    # ... and it was never printed or logged.
    assert TOKEN not in printed.out + printed.err + caplog.text
    assert "s3ss10n" not in printed.out + printed.err + caplog.text


@pytest.mark.parametrize(
    ("reject_with", "env", "message"),
    [
        (302, {}, "redirected to /dex/auth (no login given): it sits behind a sign-in gateway"),
        (401, {TOKEN_ENV: "expired-" + TOKEN}, f"refused the login from ${TOKEN_ENV} (HTTP 401)"),
        (403, {COOKIE_ENV: "authservice_session=old"}, f"refused the login from ${COOKIE_ENV} (HTTP 403)"),
    ],
    ids=["dex-redirect", "bad-token", "bad-cookie"],
)
def test_an_auth_failure_is_one_clear_error_before_anything_is_sent(
    kfp_api: FakeKfp,
    monkeypatch: pytest.MonkeyPatch,
    reject_with: int,
    env: dict[str, str],
    message: str,
) -> None:
    kfp_api.token, kfp_api.reject_with = TOKEN, reject_with
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(FedtuneError, match=re.escape(message)) as info:
        submit("--host", kfp_api.url)
    assert TOKEN_ENV in info.value.fix and COOKIE_ENV in info.value.fix
    assert TOKEN not in str(info.value) + info.value.fix
    assert [path for _, path, _ in kfp_api.requests] == ["/apis/v2beta1/healthz"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--param", "epochs=3"], "--param epochs: the pipeline has no such parameter (it has: "),
        (["--param", "job_config"], "--param 'job_config' is not key=value"),
        (["--param", "job_config={}", "--param", "job_config={}"], "--param job_config is given twice"),
        (["--cron", "0 3 * * *"], "--cron '0 3 * * *' has 5 fields; KFP's cron has 6, seconds first"),
    ],
    ids=["unknown-param", "no-equals", "twice", "unix-cron"],
)
def test_bad_params_and_schedules_are_refused_before_anything_is_created(
    kfp_api: FakeKfp, argv: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        submit("--host", kfp_api.url, *argv)
    assert info.value.fix
    assert kfp_api.runs == [] and kfp_api.pipelines == {} and kfp_api.experiments == []


def test_param_values_are_typed_by_the_pipelines_declarations() -> None:
    from fedtune.cli.submit import parse_params

    declared = {
        "rounds": {"parameterType": "NUMBER_INTEGER"},
        "lr": {"parameterType": "NUMBER_DOUBLE"},
        "resume": {"parameterType": "BOOLEAN"},
        "tenants": {"parameterType": "LIST"},
        "label": {"parameterType": "STRING"},
    }
    got = parse_params(
        ["rounds=200", "lr=2e-4", "resume=true", 'tenants=["a", "b"]', "label=a=b"], declared
    )
    assert got == {"rounds": 200, "lr": 2e-4, "resume": True, "tenants": ["a", "b"], "label": "a=b"}
    with pytest.raises(ConfigError) as info:
        parse_params(["rounds=many", "resume=yes", "tenants={}"], declared)
    text = str(info.value)
    assert "--param rounds='many' is not a valid NUMBER_INTEGER" in text
    assert "--param resume='yes' is not a valid BOOLEAN: expected true or false" in text
    assert "--param tenants='{}' is not a valid LIST: expected a JSON list" in text
