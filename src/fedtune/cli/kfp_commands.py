"""Kubeflow Pipelines subcommands: ``compile`` and ``submit``, and the kfp-local engine hook.

``register_compile`` and ``register_submit`` add the subcommands to the ``fedtune`` parser;
``run_kfp_local`` is what ``fedtune run --engine kfp-local`` calls.
"""

from __future__ import annotations

import argparse
import logging
import socket
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from rich.console import Console

from fedtune.config import load_job
from fedtune.config.base import check_dns1123_label
from fedtune.config.job import JobConfig
from fedtune.core.errors import ConfigError, FedtuneError

if TYPE_CHECKING:
    from fedtune.engines.local import RunOptions

log = logging.getLogger(__name__)
out = Console(highlight=False)

CONNECT_TIMEOUT_S = 3.0
"""How long ``submit`` waits for the KFP host to accept a connection before giving up."""


def run_kfp_local(job: JobConfig, options: RunOptions) -> dict[str, Any]:
    """Run ``job`` through its compiled pipeline with ``kfp.local``; return the run summary."""
    from fedtune.engines.kfp_local import run_job

    return run_job(job, options)


def _cluster_settings(args: argparse.Namespace) -> Any:
    from fedtune.pipelines.builder import ClusterSettings

    return ClusterSettings(
        tenants_configmap=args.tenants_configmap,
        store_secret=args.store_secret or None,
        s3_endpoint=args.s3_endpoint,
        mlflow_uri=args.mlflow_uri,
    )


def _add_pipeline_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="path of the job YAML file")
    group = p.add_argument_group("cluster settings (defaults match the fedtune Helm chart)")
    group.add_argument(
        "--tenants-configmap",
        default="fedtune-tenants",
        metavar="NAME",
        help="ConfigMap with the tenants' namespaces and Secret names (default: %(default)s)",
    )
    group.add_argument(
        "--store-secret",
        default="fedtune-object-store",
        metavar="NAME",
        help="Secret with the exchange store's access-key-id/secret-access-key "
        "(default: %(default)s; '' for ambient credentials)",
    )
    group.add_argument("--s3-endpoint", metavar="URL", help="S3 endpoint of the exchange store")
    group.add_argument("--mlflow-uri", metavar="URL", help="MLflow tracking URL for provider steps")


# -- compile --------------------------------------------------------------------------------
def compile_to(args: argparse.Namespace, output: Path) -> JobConfig:
    """Load, check and compile the job named by ``args``; return the job."""
    from fedtune.pipelines.compiling import compile_job

    job = load_job(args.job)
    compile_job(job, output, settings=_cluster_settings(args))
    return job


def _compile(args: argparse.Namespace) -> int:
    from fedtune.pipelines.run_form import family_of

    job = compile_to(args, Path(args.output))
    out.print(
        f"[green]ok[/] {args.output}: the {family_of(job.algorithm.name)} pipeline (any rounds "
        f"and tenants), job {job.name} as its default; upload it in the KFP UI or run "
        "`fedtune submit`"
    )
    return 0


def register_compile(sub: Any) -> None:
    """Add ``fedtune compile JOB.yaml -o PIPELINE.yaml``."""
    p = sub.add_parser(
        "compile",
        help="compile a job's Kubeflow pipeline to YAML",
        description="Write the pipeline of the job's algorithm family for upload in the Kubeflow "
        "Pipelines UI, the job as the run form's default. Rounds and tenants are decided when "
        "a run starts, so one file serves any number of them.",
    )
    _add_pipeline_options(p)
    p.add_argument("-o", "--output", required=True, metavar="PIPELINE.yaml", help="output file")
    p.set_defaults(handler=_compile)


# -- submit ---------------------------------------------------------------------------------
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


def _submit(args: argparse.Namespace) -> int:
    if args.namespace:
        try:
            check_dns1123_label(args.namespace)
        except ValueError as exc:
            raise ConfigError(f"--namespace {exc}", fix="Pass the KFP profile namespace.") from None
    check_reachable(args.host)  # first: seconds, not the minutes a kfp.Client retries for
    with tempfile.TemporaryDirectory(prefix="fedtune-submit-") as tmp:
        package = Path(tmp) / "pipeline.yaml"
        job = compile_to(args, package)
        import kfp
        import kfp_server_api
        import requests
        import urllib3

        transport = (
            kfp_server_api.ApiException,
            urllib3.exceptions.HTTPError,
            requests.RequestException,
            OSError,
            TimeoutError,
        )

        try:
            client = kfp.Client(host=args.host, namespace=args.namespace or "kubeflow")
            run = client.create_run_from_pipeline_package(
                str(package),
                arguments={},
                run_name=args.run_name or job.name,
                experiment_name=args.experiment,
                namespace=args.namespace,
                service_account=args.service_account,
                enable_caching=False,
            )
        except transport as exc:
            raise FedtuneError(
                f"Kubeflow Pipelines at {args.host} refused the run: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}",
                fix="Check --host, --namespace (your KFP profile) and that you may create runs.",
            ) from None
    out.print(f"[green]submitted[/] run {run.run_id} of job {job.name} to {args.host}")
    return 0


def register_submit(sub: Any) -> None:
    """Add ``fedtune submit JOB.yaml --host URL [--namespace NS] [--experiment NAME]``."""
    p = sub.add_parser(
        "submit",
        help="compile a job and start it on Kubeflow Pipelines",
        description="Compile JOB.yaml as `fedtune compile` does and start a run on the KFP "
        "instance at --host (kfp.Client).",
    )
    _add_pipeline_options(p)
    p.add_argument("--host", required=True, metavar="URL", help="Kubeflow Pipelines URL")
    p.add_argument("--namespace", metavar="NS", help="KFP profile namespace (multi-user KFP)")
    p.add_argument("--experiment", default="fedtune", metavar="NAME", help="KFP experiment")
    p.add_argument("--run-name", metavar="NAME", help="run name (default: job and rounds)")
    p.add_argument(
        "--service-account",
        metavar="NAME",
        help="ServiceAccount the run's pods use; the launcher's (<release>-launcher) may start "
        "tenant Jobs",
    )
    p.set_defaults(handler=_submit)
