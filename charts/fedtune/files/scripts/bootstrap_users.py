"""Create the least-privilege users pipeline pods log in as (Helm post-install hook).

- ``--presigner-bucket BUCKET`` (MinIO only): the MinIO user whose keys sign tenants'
  pre-signed URLs, from ``PRESIGNER_ACCESS_KEY_ID`` / ``PRESIGNER_SECRET_ACCESS_KEY``, with a
  policy that allows exactly ``s3:GetObject`` and ``s3:PutObject`` on objects of the exchange
  bucket: a URL can do no more than its signer, so a leaked URL or presigner key reaches
  neither the provider bucket, nor MLflow's artifacts, nor any listing. Signs in as MinIO's
  root user (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, endpoint ``AWS_ENDPOINT_URL_S3``).
- ``--mlflow-uri URL``: the MLflow user of pipeline pods, from ``MLFLOW_PIPELINE_USERNAME`` /
  ``MLFLOW_PIPELINE_PASSWORD``, created by the admin (``MLFLOW_TRACKING_USERNAME`` /
  ``MLFLOW_TRACKING_PASSWORD``). Not an admin: it owns what it creates, and reads the rest
  with the server's default permission.

Idempotent: an existing user gets its password and policy set again. Connection errors are
retried for ``--wait-seconds`` (the servers may still be starting). Credentials are never
printed.

Usage: ``python bootstrap_users.py [--presigner-bucket B] [--mlflow-uri URL] --wait-seconds 300``
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

LOG = logging.getLogger("bootstrap_users")
RETRY_SECONDS = 5.0
PRESIGNER_POLICY = "fedtune-presigner"


def presigner_policy(bucket: str) -> dict[str, Any]:
    """The IAM policy of the presigning user: read and write single objects of ``bucket``."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject"],
                "Resource": [f"arn:aws:s3:::{bucket}/*"],
            }
        ],
    }


def _env(name: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        raise KeyError(name)
    return value


def ensure_minio_presigner(bucket: str) -> None:
    """Create (or update) the presigning MinIO user and attach its policy."""
    from minio import MinioAdmin
    from minio.credentials import StaticProvider

    # Every variable first: a missing one must fail before anything is created.
    endpoint = urlsplit(_env("AWS_ENDPOINT_URL_S3"))
    root = StaticProvider(_env("AWS_ACCESS_KEY_ID"), _env("AWS_SECRET_ACCESS_KEY"))
    user, secret = _env("PRESIGNER_ACCESS_KEY_ID"), _env("PRESIGNER_SECRET_ACCESS_KEY")
    admin = MinioAdmin(
        endpoint=endpoint.netloc, credentials=root, secure=endpoint.scheme == "https"
    )
    admin.policy_add(PRESIGNER_POLICY, policy=presigner_policy(bucket))
    admin.user_add(user, secret)
    admin.policy_set(PRESIGNER_POLICY, user=user)
    LOG.info("MinIO user for pre-signed URLs ready (policy %s on s3://%s/*)", PRESIGNER_POLICY, bucket)


def ensure_mlflow_user(tracking_uri: str) -> None:
    """Create the pipeline's MLflow user, or reset its password, as the admin."""
    from mlflow.exceptions import RestException
    from mlflow.server.auth.client import AuthServiceClient

    username = _env("MLFLOW_PIPELINE_USERNAME")
    password = _env("MLFLOW_PIPELINE_PASSWORD")
    for admin_login in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        _env(admin_login)  # the client signs in with these; refuse early when unset
    client = AuthServiceClient(tracking_uri)
    try:
        client.create_user(username, password)
        LOG.info("MLflow user %s created", username)
    except RestException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        client.update_user_password(username, password)
        LOG.info("MLflow user %s already exists; password updated", username)


def retrying(step: Callable[[], None], wait_seconds: float, what: str) -> None:
    """Run ``step``, retrying connection failures until ``wait_seconds`` have passed."""
    import requests
    import urllib3

    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            step()
            return
        except (requests.ConnectionError, urllib3.exceptions.HTTPError, ConnectionError) as exc:
            if time.monotonic() >= deadline:
                raise ConnectionError(f"{what} unreachable: {type(exc).__name__}") from None
            LOG.info("%s not reachable yet; retrying in %.0fs", what, RETRY_SECONDS)
            time.sleep(RETRY_SECONDS)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presigner-bucket", help="exchange bucket (MinIO presigning user)")
    parser.add_argument("--mlflow-uri", help="MLflow URL (pipeline user)")
    parser.add_argument("--wait-seconds", type=float, default=300.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        if args.presigner_bucket:
            retrying(
                lambda: ensure_minio_presigner(args.presigner_bucket), args.wait_seconds, "MinIO"
            )
        if args.mlflow_uri:
            retrying(lambda: ensure_mlflow_user(args.mlflow_uri), args.wait_seconds, "MLflow")
    except KeyError as exc:
        LOG.error(
            "environment variable %s is empty\nfix: create the Secrets named by "
            "objectStore.presignerSecret (keys access-key-id, secret-access-key) and "
            "mlflow.auth.pipelineSecret (keys username, password) in the release namespace.",
            exc.args[0],
        )
        return 2
    except ConnectionError as exc:
        LOG.error("%s\nfix: check that the object store and MLflow are running.", exc)
        return 4
    except Exception as exc:  # the server's refusal: say which, never the credentials
        LOG.error(
            "%s: %s\nfix: check the admin credentials (objectStore.existingSecret, "
            "mlflow.auth.existingSecret).",
            type(exc).__name__,
            str(exc).splitlines()[0] if str(exc) else "",
        )
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
