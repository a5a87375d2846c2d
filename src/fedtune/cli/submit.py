"""``fedtune submit``: compile a job and start it on Kubeflow Pipelines, as a Kubeflow user would.

The compiled pipeline is either sent with the run (the default) or uploaded first as a new
version of a named pipeline (``--pipeline``), so the KFP UI lists every submitted version
under one pipeline and "Create run" there re-runs any of them. ``--param key=value``
overrides a pipeline parameter, checked against the compiled pipeline's own parameter list
and types before anything is sent. ``--cron`` creates a recurring run instead of a single one.

KFP behind Dex / oauth2-proxy (a Kubeflow platform) needs a login: a bearer token from
``$FEDTUNE_KFP_TOKEN`` (e.g. a ServiceAccount token with the ``pipelines.kubeflow.org``
audience) or a session cookie from ``$FEDTUNE_KFP_COOKIE`` (``name=value``, copied from a
signed-in browser). Both come from the environment only, never from the command line (which
shell history and ``ps`` keep), and are never printed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from rich.console import Console

from fedtune.config.base import check_dns1123_label
from fedtune.core.errors import ConfigError, FedtuneError

log = logging.getLogger(__name__)
out = Console(highlight=False)

CONNECT_TIMEOUT_S = 3.0
"""How long ``submit`` waits for the KFP host to accept a connection before giving up."""
TOKEN_ENV = "FEDTUNE_KFP_TOKEN"
COOKIE_ENV = "FEDTUNE_KFP_COOKIE"
_AUTH_FIX = (
    f"Set ${TOKEN_ENV} to a bearer token KFP accepts (in a cluster: `kubectl create token "
    f"<service-account> --audience pipelines.kubeflow.org`), or ${COOKIE_ENV} to the session "
    "cookie of a signed-in browser (e.g. authservice_session=... or oauth2_proxy_kubeflow=...)."
)


# -- reaching KFP --------------------------------------------------------------------------
def check_reachable(host: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Fail fast, with a clear message, when nothing listens at the KFP ``host`` URL."""
    parts = urlsplit(host)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"--host {host!r} is not an http(s) URL",
            fix="Pass the Kubeflow Pipelines URL, e.g. http://localhost:8080.",
        )
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise FedtuneError(
            f"cannot reach Kubeflow Pipelines at {host}: {reason} "
            f"(host {parts.hostname}, port {port})",
            fix="Check --host; for a cluster without ingress, run `kubectl -n kubeflow "
            "port-forward svc/ml-pipeline-ui 8080:80` and pass --host http://localhost:8080.",
        ) from None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a login redirect is an answer here, not something to follow


def auth_from_env() -> tuple[str | None, str | None]:
    """(bearer token, cookie) from the environment; either may be None."""
    return os.environ.get(TOKEN_ENV) or None, os.environ.get(COOKIE_ENV) or None


def check_signed_in(host: str, token: str | None, cookie: str | None) -> None:
    """Ask KFP's health endpoint with the login; refuse clearly when the gateway does.

    Behind oauth2-proxy / Dex an unauthenticated API call is redirected to a login page,
    which kfp.Client would follow and then fail to parse as JSON; asked here first, the
    redirect and 401/403 become one clear error.
    """
    request = urllib.request.Request(f"{host.rstrip('/')}/apis/v2beta1/healthz")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if cookie:
        request.add_header("Cookie", cookie)
    opener = urllib.request.build_opener(_NoRedirect)
    login = f"the login from ${TOKEN_ENV if token else COOKIE_ENV}"
    if not (token or cookie):
        login = "no login given"
    try:
        with opener.open(request, timeout=30) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code in (301, 302, 303, 307, 308):
            target = urlsplit(exc.headers.get("Location", "")).path or "a login page"
            raise FedtuneError(
                f"Kubeflow Pipelines at {host} redirected to {target} ({login}): it sits "
                "behind a sign-in gateway (Dex / oauth2-proxy)",
                fix=_AUTH_FIX,
            ) from None
        if exc.code in (401, 403):
            raise FedtuneError(
                f"Kubeflow Pipelines at {host} refused {login} (HTTP {exc.code})",
                fix=_AUTH_FIX,
            ) from None
        raise FedtuneError(
            f"Kubeflow Pipelines at {host} answered HTTP {exc.code} to its health check",
            fix="Check --host: it must be the KFP UI or API address.",
        ) from None
    try:
        json.loads(body)
    except ValueError:
        raise FedtuneError(
            f"{host} answered its health check with something that is not KFP's JSON "
            f"({login}); probably a sign-in page",
            fix=_AUTH_FIX,
        ) from None


# -- parameters ----------------------------------------------------------------------------
def pipeline_parameters(package: Path) -> dict[str, dict[str, Any]]:
    """The compiled pipeline's run parameters: name -> {parameterType, defaultValue, ...}."""
    spec = next(yaml.safe_load_all(package.read_text(encoding="utf-8")))
    params = spec["root"].get("inputDefinitions", {}).get("parameters", {})
    return {name: dict(value) for name, value in params.items()}


def _convert(kind: str, raw: str) -> Any:
    """``raw`` as the KFP parameter type ``kind``; ValueError with a reason otherwise."""
    if kind == "STRING":
        return raw
    if kind == "NUMBER_INTEGER":
        return int(raw)
    if kind == "NUMBER_DOUBLE":
        return float(raw)
    if kind == "BOOLEAN":
        if raw.lower() not in ("true", "false"):
            raise ValueError("expected true or false")
        return raw.lower() == "true"
    value = json.loads(raw)  # LIST / STRUCT
    expected = list if kind == "LIST" else dict
    if not isinstance(value, expected):
        raise ValueError(f"expected a JSON {'list' if kind == 'LIST' else 'object'}")
    return value


def parse_params(pairs: list[str], declared: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``--param key=value`` pairs, typed by the pipeline's declarations; every problem at once.

    Raises:
        ConfigError: A pair without ``=``, a key given twice, a key the pipeline does not
            declare, or a value that is not of the parameter's type.
    """
    values: dict[str, Any] = {}
    problems: list[str] = []
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(f"--param {pair!r} is not key=value")
            continue
        if key in values:
            problems.append(f"--param {key} is given twice")
            continue
        if key not in declared:
            problems.append(
                f"--param {key}: the pipeline has no such parameter (it has: "
                f"{', '.join(sorted(declared)) or 'none'})"
            )
            continue
        kind = str(declared[key].get("parameterType", "STRING"))
        try:
            values[key] = _convert(kind, raw)
        except ValueError as exc:
            problems.append(f"--param {key}={raw!r} is not a valid {kind}: {exc}")
    if problems:
        raise ConfigError(
            "; ".join(problems),
            fix="Use --param NAME=VALUE with a parameter of the compiled pipeline, e.g. "
            "--param job_config='{...}' (JSON for lists and objects).",
        )
    return values


def check_cron(expression: str) -> str:
    """KFP's cron has 6 fields, seconds first (robfig/cron); refuse a 5-field Unix one."""
    fields = expression.split()
    if len(fields) != 6:
        raise ConfigError(
            f"--cron {expression!r} has {len(fields)} fields; KFP's cron has 6, seconds first",
            fix="Prefix a Unix cron with the seconds field, e.g. '0 0 3 * * *' for 03:00 daily.",
        )
    return " ".join(fields)


# -- the command ---------------------------------------------------------------------------
def _client(args: argparse.Namespace, token: str | None, cookie: str | None) -> Any:
    import kfp

    return kfp.Client(
        host=args.host,
        namespace=args.namespace or "kubeflow",
        existing_token=token,
        cookies=cookie,
    )


def _upload_version(
    client: Any, package: Path, pipeline: str, version: str, namespace: str | None
) -> tuple[str, str]:
    """Upload ``package`` as version ``version`` of pipeline ``pipeline`` (created when new)
    in ``namespace``, where it is looked up too: ``kfp.Client.get_pipeline_id`` sends no
    namespace and so never finds a pipeline of a profile namespace (the chart's, with
    ``pipelines.kfpNamespace``), and creating it again fails on "already exists"."""
    name_filter = json.dumps(
        {"predicates": [{"operation": "EQUALS", "key": "display_name", "stringValue": pipeline}]}
    )
    listed = client.list_pipelines(filter=name_filter, namespace=namespace, page_size=2)
    found = [p for p in (listed.pipelines or []) if p.display_name == pipeline]
    pipeline_id = found[0].pipeline_id if found else None
    if pipeline_id is None:
        created = client.upload_pipeline(
            str(package), pipeline_name=pipeline, namespace=namespace
        )
        pipeline_id = created.pipeline_id
        versions = client.list_pipeline_versions(
            pipeline_id, page_size=1, sort_by="created_at desc"
        )
        return pipeline_id, versions.pipeline_versions[0].pipeline_version_id
    uploaded = client.upload_pipeline_version(
        str(package), pipeline_version_name=version, pipeline_id=pipeline_id
    )
    return pipeline_id, uploaded.pipeline_version_id


def _submit(args: argparse.Namespace) -> int:
    from fedtune.cli.kfp_commands import compile_to

    if args.namespace:
        try:
            check_dns1123_label(args.namespace)
        except ValueError as exc:
            raise ConfigError(f"--namespace {exc}", fix="Pass the KFP profile namespace.") from None
    cron = check_cron(args.cron) if args.cron else None
    check_reachable(args.host)  # first: seconds, not the minutes a kfp.Client retries for
    token, cookie = auth_from_env()
    check_signed_in(args.host, token, cookie)
    with tempfile.TemporaryDirectory(prefix="fedtune-submit-") as tmp:
        package = Path(tmp) / "pipeline.yaml"
        job = compile_to(args, package)
        params = parse_params(args.param, pipeline_parameters(package))
        name = args.run_name or job.name
        import kfp_server_api
        import requests
        import urllib3

        transport = (
            kfp_server_api.ApiException,
            urllib3.exceptions.HTTPError,
            requests.RequestException,
            OSError,
            TimeoutError,
            ValueError,
        )
        try:
            client = _client(args, token, cookie)
            experiment = client.create_experiment(args.experiment, namespace=args.namespace)
            source: dict[str, Any] = {"pipeline_package_path": str(package)}
            where = ""
            if args.pipeline:
                version = args.pipeline_version or f"{job.name}-{time.strftime('%Y%m%d-%H%M%S')}"
                pipeline_id, version_id = _upload_version(
                    client, package, args.pipeline, version, args.namespace
                )
                source = {"pipeline_id": pipeline_id, "version_id": version_id}
                where = f" (pipeline {args.pipeline!r}, version {version_id})"
            common = {
                "experiment_id": experiment.experiment_id,
                "job_name": name,
                "params": params,
                "enable_caching": False if "pipeline_package_path" in source else None,
                "service_account": args.service_account,
                **source,
            }
            if cron:
                recurring = client.create_recurring_run(
                    cron_expression=cron, max_concurrency=1, no_catchup=True, **common
                )
                done = f"recurring run {recurring.recurring_run_id} ({cron})"
            else:
                run = client.run_pipeline(**common)
                done = f"run {run.run_id}"
        except transport as exc:
            status = getattr(exc, "status", None)
            if status in (401, 403):
                raise FedtuneError(
                    f"Kubeflow Pipelines at {args.host} refused the login (HTTP {status})",
                    fix=_AUTH_FIX,
                ) from None
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise FedtuneError(
                f"Kubeflow Pipelines at {args.host} refused the submission: "
                f"{type(exc).__name__}: {first}",
                fix="Check --host, --namespace (your KFP profile) and that you may create "
                "pipelines and runs there.",
            ) from None
    out.print(f"[green]submitted[/] {done} of job {job.name} to {args.host}{where}")
    return 0


def register_submit(sub: Any) -> None:
    """Add ``fedtune submit JOB.yaml --host URL [...]``."""
    from fedtune.cli.kfp_commands import add_pipeline_options

    p = sub.add_parser(
        "submit",
        help="compile a job and start it on Kubeflow Pipelines",
        description="Compile JOB.yaml as `fedtune compile` does and start a run (or, with "
        "--cron, a recurring run) on the KFP instance at --host. Behind Dex/oauth2-proxy, "
        f"sign in with ${TOKEN_ENV} (bearer token) or ${COOKIE_ENV} (session cookie).",
    )
    add_pipeline_options(p)
    p.add_argument("--host", required=True, metavar="URL", help="Kubeflow Pipelines URL")
    p.add_argument("--namespace", metavar="NS", help="KFP profile namespace (multi-user KFP)")
    p.add_argument("--experiment", default="fedtune", metavar="NAME", help="KFP experiment")
    p.add_argument("--run-name", metavar="NAME", help="run name (default: job and rounds)")
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a pipeline parameter (repeatable; JSON for lists and objects)",
    )
    p.add_argument(
        "--pipeline",
        metavar="NAME",
        help="upload the compiled pipeline as a new version of this pipeline (created when "
        "new) and run that version",
    )
    p.add_argument(
        "--pipeline-version",
        metavar="NAME",
        help="name of the uploaded version (default: job name and time)",
    )
    p.add_argument(
        "--cron",
        metavar="EXPR",
        help="create a recurring run on this KFP cron schedule (6 fields, seconds first, e.g. "
        "'0 0 3 * * 1' for Mondays 03:00) instead of one run",
    )
    p.add_argument(
        "--service-account",
        metavar="NAME",
        help="ServiceAccount the run's pods use; the launcher's (<release>-launcher) may start "
        "tenant Jobs",
    )
    p.set_defaults(handler=_submit)
