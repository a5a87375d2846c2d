"""Upload the chart's compiled pipelines to Kubeflow Pipelines (Helm post-install/upgrade hook).

Each ``*.yaml`` in the pipelines directory becomes the KFP pipeline its file names itself
(``pipelineInfo.name``: ``fedtune-fedit``, ``fedtune-fedit-gpu``, ...), the names
``fedtune submit --pipeline`` and the docs use, in ``--namespace`` (empty: shared pipelines).
Before upload, every task image is pointed at ``--cpu-image`` / ``--gpu-image`` (the chart's
``image.*`` values, by digest when one is set). Each file is uploaded as version
``<pipeline>-<version-name>-<sha256 of the uploaded text, 12 hex>``: a pipeline that does not
exist yet is created, a version that exists already is skipped, so re-running the hook
(``helm upgrade`` with unchanged files) changes nothing, and a changed file adds one version
beside the earlier ones, whose runs stay as they were.

Usage: ``python upload_pipelines.py --host URL --dir DIR --version-name NAME [--namespace NS]
[--cpu-image REF --gpu-image REF]``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

LOG = logging.getLogger("upload_pipelines")


def _by_name(name: str) -> str:
    """A KFP list filter: display_name equals ``name``."""
    return json.dumps(
        {"predicates": [{"operation": "EQUALS", "key": "display_name", "stringValue": name}]}
    )


def pipeline_id(client: Any, name: str, namespace: str | None) -> str | None:
    """The id of the pipeline called ``name`` in ``namespace`` (None: shared), if any.

    ``kfp.Client.get_pipeline_id`` sends no namespace, so in multi-user KFP it never finds a
    namespaced pipeline; this asks in the right one.
    """
    found = client.list_pipelines(filter=_by_name(name), namespace=namespace, page_size=2)
    matches = [p for p in (found.pipelines or []) if p.display_name == name]
    return matches[0].pipeline_id if matches else None


def has_version(client: Any, pipeline: str, version: str) -> bool:
    """True when pipeline ``pipeline`` has a version called ``version``."""
    found = client.list_pipeline_versions(pipeline, filter=_by_name(version), page_size=2)
    return any(v.display_name == version for v in (found.pipeline_versions or []))


def create_pipeline(client: Any, name: str, namespace: str | None) -> str:
    """Create an empty pipeline (its versions are uploaded next); return its id."""
    import kfp_server_api

    body = kfp_server_api.V2beta1Pipeline(display_name=name, namespace=namespace)
    return str(client._pipelines_api.pipeline_service_create_pipeline(body).pipeline_id)


def prepared(path: Path, images: tuple[str, str] | None) -> tuple[str, str]:
    """The pipeline's name and the text to upload (task images retargeted)."""
    import yaml

    text = path.read_text(encoding="utf-8")
    if images is not None:
        from fedtune.core.images import Images
        from fedtune.pipelines.images import retarget_text

        text = retarget_text(text, Images(cpu=images[0], gpu=images[1]))
    name = next(yaml.safe_load_all(text))["pipelineInfo"]["name"]
    return str(name), text


def token_credentials() -> Any:
    """The Job's projected KFP token (``$KF_PIPELINES_SA_TOKEN_PATH``), when mounted.

    ``kfp.Client`` reads that token by itself only when no host is given; with ``--host`` it
    would send no login at all, which multi-user KFP refuses.
    """
    path = os.environ.get("KF_PIPELINES_SA_TOKEN_PATH")
    if not path or not Path(path).is_file():
        return None
    from kfp.client import ServiceAccountTokenVolumeCredentials

    return ServiceAccountTokenVolumeCredentials(path=path)


def upload_all(
    host: str,
    directory: Path,
    version_name: str,
    namespace: str | None,
    images: tuple[str, str] | None = None,
) -> dict[str, str]:
    """Upload every compiled pipeline in ``directory``; return ``{pipeline: version}``, the
    version each pipeline now has for its file ("" where nothing had to be uploaded)."""
    files = sorted(directory.glob("*.yaml"))
    if not files:
        LOG.info("no compiled pipelines in %s; nothing to upload", directory)
        return {}
    # Imported here so the no-files path above works without kfp installed.
    import kfp

    client = kfp.Client(host=host, namespace=namespace, credentials=token_credentials())
    done: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="fedtune-upload-") as tmp:
        for path in files:
            name, text = prepared(path, images)
            version = f"{name}-{version_name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
            where = f"namespace {namespace}" if namespace else "shared pipelines"
            pid = pipeline_id(client, name, namespace)
            if pid is None:
                pid = create_pipeline(client, name, namespace)
                LOG.info("created pipeline %s (%s)", name, where)
            elif has_version(client, pid, version):
                LOG.info("pipeline %s already has version %s; skipped", name, version)
                done[name] = ""
                continue
            package = Path(tmp) / path.name
            package.write_text(text, encoding="utf-8")
            client.upload_pipeline_version(
                str(package), pipeline_version_name=version, pipeline_id=pid
            )
            LOG.info("uploaded version %s of pipeline %s (%s)", version, name, where)
            done[name] = version
    return done


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", required=True, help="KFP API URL")
    parser.add_argument("--dir", type=Path, required=True, help="directory of compiled YAML")
    parser.add_argument("--version-name", required=True, help="e.g. the chart's appVersion")
    parser.add_argument("--namespace", default="", help="KFP namespace (empty: shared)")
    parser.add_argument("--cpu-image", default="", help="image of the CPU tasks")
    parser.add_argument("--gpu-image", default="", help="image of the GPU tasks and tenant Jobs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    if bool(args.cpu_image) != bool(args.gpu_image):
        LOG.error(
            "--cpu-image and --gpu-image go together (got only %s)",
            "--cpu-image" if args.cpu_image else "--gpu-image",
        )
        return 2
    images = (args.cpu_image, args.gpu_image) if args.cpu_image else None
    try:
        upload_all(args.host, args.dir, args.version_name, args.namespace or None, images)
    except Exception as exc:  # noqa: BLE001 - any failure ends the hook with its reason
        LOG.error(
            "uploading to %s failed: %s\nfix: check pipelines.kfpApiUrl, and that the Job's "
            "ServiceAccount may create pipelines (pipelines.serviceAccountName).",
            args.host,
            exc,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
