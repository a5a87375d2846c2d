"""Create the exchange and artifact buckets if they are missing (Helm post-install hook).

Run inside the fedtune CPU image with the S3 credentials in the environment
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, optional ``AWS_ENDPOINT_URL_S3``). The
object store may still be starting when the hook runs, so connection errors are retried for
``--wait-seconds``; any other error (wrong credentials, a name taken by someone else) fails
at once with its reason.

Usage: ``python bootstrap_buckets.py --wait-seconds 300 BUCKET [BUCKET ...]``
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import boto3
from botocore.exceptions import ClientError, EndpointConnectionError

LOG = logging.getLogger("bootstrap_buckets")
RETRY_SECONDS = 5.0


def ensure_bucket(s3: object, bucket: str, region: str) -> bool:
    """Create ``bucket`` unless it exists; return True when it was created."""
    try:
        s3.head_bucket(Bucket=bucket)  # type: ignore[attr-defined]
        return False
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code not in ("404", "NoSuchBucket", "NotFound"):
            raise
    kwargs: dict[str, object] = {"Bucket": bucket}
    # us-east-1 is the one region that rejects an explicit LocationConstraint.
    if region and region != "us-east-1":
        kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
    s3.create_bucket(**kwargs)  # type: ignore[attr-defined]
    return True


def run(buckets: list[str], wait_seconds: float) -> None:
    """Ensure every bucket exists, retrying connection errors until the deadline."""
    region = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
    s3 = boto3.client("s3", region_name=region)
    deadline = time.monotonic() + wait_seconds
    for bucket in buckets:
        while True:
            try:
                created = ensure_bucket(s3, bucket, region)
                LOG.info("bucket %s %s", bucket, "created" if created else "already exists")
                break
            except EndpointConnectionError:
                if time.monotonic() >= deadline:
                    raise
                LOG.info("object store not reachable yet; retrying in %.0fs", RETRY_SECONDS)
                time.sleep(RETRY_SECONDS)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("buckets", nargs="+")
    parser.add_argument("--wait-seconds", type=float, default=300.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        run(args.buckets, args.wait_seconds)
    except EndpointConnectionError as exc:
        LOG.error(
            "%s\nfix: check objectStore.mode and the endpoint; is the object store running?", exc
        )
        return 4
    except ClientError as exc:
        LOG.error(
            "%s\nfix: check the credentials in objectStore.existingSecret and that the bucket "
            "names are not taken by another account.",
            exc,
        )
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
