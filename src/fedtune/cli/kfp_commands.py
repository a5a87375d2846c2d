"""Kubeflow Pipelines: ``fedtune compile``, the options it shares with ``fedtune submit``
(:mod:`fedtune.cli.submit`), and the kfp-local engine hook.

``register_compile`` adds the subcommand to the ``fedtune`` parser; ``run_kfp_local`` is what
``fedtune run --engine kfp-local`` calls.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from fedtune.cli.arguments import add_set_option
from fedtune.config import load_job
from fedtune.config.job import JobConfig
from fedtune.config.secrets import MLFLOW_SECRET, PRESIGNER_SECRET, PROVIDER_S3_SECRET

if TYPE_CHECKING:
    from fedtune.engines.local import RunOptions

log = logging.getLogger(__name__)
out = Console(highlight=False)


def run_kfp_local(job: JobConfig, options: RunOptions) -> dict[str, Any]:
    """Run ``job`` through its compiled pipeline with ``kfp.local``; return the run summary."""
    from fedtune.pipelines.kfp_local import run_job

    return run_job(job, options)


def _cluster_settings(args: argparse.Namespace) -> Any:
    from fedtune.pipelines.builder import ClusterSettings

    return ClusterSettings(
        tenants_configmap=args.tenants_configmap,
        store_secret=args.store_secret or None,
        s3_endpoint=args.s3_endpoint,
        mlflow_uri=args.mlflow_uri,
        mlflow_secret=args.mlflow_secret or None,
        presigner_secret=args.presigner_secret or None,
        images=_images(args),
    )


def _images(args: argparse.Namespace) -> Any:
    """The images ``--image-registry``, ``--cpu-digest`` and ``--gpu-digest`` name (None:
    the defaults the components are declared with).

    Raises:
        ConfigError: A malformed registry or digest, naming the flag.
    """
    from fedtune.core.errors import ConfigError
    from fedtune.core.images import REGISTRY, Images

    if not (args.image_registry or args.cpu_digest or args.gpu_digest):
        return None
    try:
        return Images.of(
            args.image_registry or REGISTRY,
            cpu_digest=args.cpu_digest or None,
            gpu_digest=args.gpu_digest or None,
        )
    except ValueError as exc:
        raise ConfigError(
            f"--image-registry/--cpu-digest/--gpu-digest: {exc}",
            fix="Pass the registry path the fedtune images are mirrored under (e.g. "
            "--image-registry registry.example.com/mirror/fedtune) and digests as "
            "sha256:<64 hex> (`crane digest IMAGE` or `docker buildx imagetools inspect IMAGE`).",
        ) from None


def add_pipeline_options(p: argparse.ArgumentParser) -> None:
    """The job, its round range and the cluster settings (``compile`` and ``submit``)."""
    p.add_argument("job", help="path of the job YAML file")
    add_set_option(p)
    group = p.add_argument_group("cluster settings (defaults match the fedtune Helm chart)")
    group.add_argument(
        "--tenants-configmap",
        default="fedtune-tenants",
        metavar="NAME",
        help="ConfigMap with the tenants' namespaces and Secret names (default: %(default)s)",
    )
    group.add_argument(
        "--store-secret",
        default=PROVIDER_S3_SECRET,
        metavar="NAME",
        help="Secret with the exchange store's access-key-id/secret-access-key "
        "(the chart's objectStore.existingSecret; default: %(default)s; '' for ambient "
        "credentials)",
    )
    group.add_argument("--s3-endpoint", metavar="URL", help="S3 endpoint of the exchange store")
    group.add_argument("--mlflow-uri", metavar="URL", help="MLflow tracking URL for provider steps")
    group.add_argument(
        "--mlflow-secret",
        default=MLFLOW_SECRET,
        metavar="NAME",
        help="Secret with the MLflow username/password of provider steps when MLflow auth is "
        "on (the chart's mlflow.auth.pipelineSecret; optional in the cluster; default: "
        "%(default)s)",
    )
    group.add_argument(
        "--presigner-secret",
        default=PRESIGNER_SECRET,
        metavar="NAME",
        help="Secret with the access-key-id/secret-access-key that sign tenants' URLs (the "
        "chart's objectStore.presignerSecret; optional in the cluster; default: %(default)s)",
    )
    images = p.add_argument_group(
        "images (default: ghcr.io/fedtune/fedtune-cpu and -gpu, tagged with this version)"
    )
    images.add_argument(
        "--image-registry",
        metavar="REG",
        help="registry path of fedtune-cpu and fedtune-gpu for every task and the tenant Jobs "
        "(e.g. registry.example.com/mirror/fedtune; the chart's image.registry + repository)",
    )
    images.add_argument(
        "--cpu-digest", metavar="sha256:…", help="run the CPU image by this digest, not by tag"
    )
    images.add_argument(
        "--gpu-digest",
        metavar="sha256:…",
        help="run the GPU image by this digest (what tenant admission policies admit)",
    )


# -- compile --------------------------------------------------------------------------------
def compile_to(args: argparse.Namespace, output: Path) -> JobConfig:
    """Load, check and compile the job named by ``args``; return the job."""
    from fedtune.pipelines.compiling import compile_job

    job = load_job(args.job, args.overrides)
    compile_job(job, output, settings=_cluster_settings(args))
    return job


def _compile(args: argparse.Namespace) -> int:
    from fedtune.pipelines.run_form import family_of, pipeline_name

    job = compile_to(args, Path(args.output))
    name = pipeline_name(
        family_of(job.algorithm.name), job.secure_aggregation.enabled, gpu=job.provider.gpu > 0
    )
    out.print(
        f"[green]ok[/] {args.output}: the {name} pipeline (any rounds "
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
    add_pipeline_options(p)
    p.add_argument("-o", "--output", required=True, metavar="PIPELINE.yaml", help="output file")
    p.set_defaults(handler=_compile)
