"""Store.copy: one message sent to many prefixes without passing through the process again."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedtune.core.errors import IntegrityError, StoreError
from fedtune.storage import Store, open_store
from tests.helpers.stores import Backend

DATA = bytes(range(256)) * 40


def test_copy_inside_one_backend_moves_no_bytes_and_stays_independent(store: Store) -> None:
    a, b = store.child("tenants/a"), store.child("tenants/b")
    a.put_bytes("round-1/broadcast.safetensors", DATA)
    assert a.copy("round-1/broadcast.safetensors", b, "round-1/broadcast.safetensors") == 0
    assert b.get_bytes("round-1/broadcast.safetensors") == DATA  # verified against its sidecar
    # Later writes and deletes through one name never change the other's bytes.
    a.put_bytes("round-1/broadcast.safetensors", b"replaced")
    assert b.get_bytes("round-1/broadcast.safetensors") == DATA
    a.delete("round-1/broadcast.safetensors")
    assert b.get_bytes("round-1/broadcast.safetensors") == DATA
    # Copying again over a different blob replaces it whole, checksum included.
    a.put_bytes("new", b"second")
    assert a.copy("new", b, "round-1/broadcast.safetensors") == 0
    assert b.get_bytes("round-1/broadcast.safetensors") == b"second"


def test_copy_on_a_file_store_is_a_hard_link(tmp_path: Path) -> None:
    root = open_store(str(tmp_path / "exchange"))
    root.child("tenants/a").put_bytes("m", DATA)
    root.child("tenants/a").copy("m", root.child("tenants/b"), "m")
    src, dst = tmp_path / "exchange/tenants/a/m", tmp_path / "exchange/tenants/b/m"
    assert src.stat().st_ino == dst.stat().st_ino
    assert (src.parent / "m.sha256").stat().st_ino == (dst.parent / "m.sha256").stat().st_ino


def test_copy_across_backends_writes_through_the_process(bucket: str, tmp_path: Path) -> None:
    s3, folder = open_store(f"s3://{bucket}/root"), open_store(str(tmp_path / "folder"))
    s3.put_bytes("m", DATA)
    assert s3.copy("m", folder, "copy/m") == len(DATA)
    assert folder.copy("copy/m", s3, "back/m") == len(DATA)
    assert s3.get_bytes("back/m") == folder.get_bytes("copy/m") == DATA


def test_copy_of_a_missing_or_incomplete_blob_is_refused(backend: Backend) -> None:
    store = backend.store
    with pytest.raises(StoreError, match="no blob at key 'absent'"):
        store.copy("absent", store.child("x"), "absent")
    backend.write_raw("half", b"no sidecar")  # a write that did not finish
    with pytest.raises(StoreError, match="no .sha256 checksum"):
        store.copy("half", store.child("x"), "half")
    assert store.child("x").list() == []


def test_a_damaged_source_is_caught_by_the_copys_reader(backend: Backend) -> None:
    backend.store.put_bytes("m", DATA)
    backend.write_raw("m", DATA[:-1] + b"\x00")  # damaged after its checksum was written
    backend.store.copy("m", backend.store.child("t"), "m")
    with pytest.raises(IntegrityError, match="does not match its checksum"):
        backend.store.child("t").get_bytes("m")
