"""Both store backends behind one test harness, with raw access behind the store's back.

A :class:`Backend` lets a test simulate what a crash, a person, or an attacker does to the
objects of a store (rewrite bytes, drop a sidecar) and then check how the store reacts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fedtune.storage import Store, open_store
from tests.helpers.moto import admin_client


@dataclass
class Backend:
    """A store plus raw access to the objects under its root."""

    name: str
    store: Store
    write_raw: Callable[[str, bytes], None]
    delete_raw: Callable[[str], None]
    names_raw: Callable[[], list[str]]


def local_backend(root: Path) -> Backend:
    """A local store rooted at ``root`` (created on first write)."""

    def write_raw(name: str, data: bytes) -> None:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def names_raw() -> list[str]:
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())

    return Backend(
        "local", open_store(str(root)), write_raw, lambda name: (root / name).unlink(), names_raw
    )


def s3_backend(endpoint_url: str, bucket: str, prefix: str = "root") -> Backend:
    """An S3 store at ``s3://bucket/prefix`` (credentials from the environment)."""
    client = admin_client(endpoint_url)
    head = prefix + "/"

    def names_raw() -> list[str]:
        listing = client.list_objects_v2(Bucket=bucket)
        return sorted(o["Key"].removeprefix(head) for o in listing.get("Contents", []))

    return Backend(
        "s3",
        open_store(f"s3://{bucket}/{prefix}", endpoint_url=endpoint_url),
        lambda name, data: client.put_object(Bucket=bucket, Key=head + name, Body=data),
        lambda name: client.delete_object(Bucket=bucket, Key=head + name),
        names_raw,
    )
