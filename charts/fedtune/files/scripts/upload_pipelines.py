"""Upload compiled pipelines to Kubeflow Pipelines (Helm post-install hook).

Each ``*.yaml`` in the pipelines directory becomes a KFP pipeline named after the file stem;
when a pipeline of that name exists, the file is added as a new version named after the chart
release revision, so upgrades keep the run history of earlier versions.

Usage: ``python upload_pipelines.py --host URL --dir DIR --version-name NAME [--namespace NS]``
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

LOG = logging.getLogger("upload_pipelines")


def upload_all(host: str, directory: Path, version_name: str, namespace: str | None) -> int:
    """Upload every compiled pipeline in ``directory``; return how many were sent."""
    files = sorted(directory.glob("*.yaml"))
    if not files:
        LOG.info("no compiled pipelines in %s; nothing to upload", directory)
        return 0
    # Imported here so the no-files path above works without kfp installed.
    import kfp

    client = kfp.Client(host=host, namespace=namespace)
    for path in files:
        name = path.stem
        pipeline_id = client.get_pipeline_id(name)
        if pipeline_id is None:
            client.upload_pipeline(str(path), pipeline_name=name, namespace=namespace)
            LOG.info("uploaded pipeline %s", name)
        else:
            client.upload_pipeline_version(
                str(path), pipeline_version_name=f"{name}-{version_name}", pipeline_id=pipeline_id
            )
            LOG.info("uploaded version %s-%s of pipeline %s", name, version_name, name)
    return len(files)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", required=True, help="KFP API URL")
    parser.add_argument("--dir", type=Path, required=True, help="directory of compiled YAML")
    parser.add_argument("--version-name", required=True)
    parser.add_argument("--namespace", default="")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        upload_all(args.host, args.dir, args.version_name, args.namespace or None)
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
