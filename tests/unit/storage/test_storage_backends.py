"""The Store contract, run against both backends (local folder and S3 over HTTP)."""

from __future__ import annotations

import pytest

from fedtune.core.errors import IntegrityError, StoreError
from fedtune.storage import Store
from fedtune.storage.keys import sha256_hex
from tests.helpers.stores import Backend

ROUND_TRIP_BYTES = [
    ("empty", b""),
    ("ascii", b"hello"),
    ("binary", bytes(range(256)) * 3),
    ("looks-like-json", b'{"a": 1}'),
]


@pytest.mark.parametrize(
    "data", [c[1] for c in ROUND_TRIP_BYTES], ids=[c[0] for c in ROUND_TRIP_BYTES]
)
def test_bytes_round_trip(store: Store, data: bytes) -> None:
    assert store.put_bytes("a/b/blob.bin", data) == len(data)
    assert store.exists("a/b/blob.bin")
    assert store.get_bytes("a/b/blob.bin") == data


def test_sidecar_holds_sha256_hex(backend: Backend) -> None:
    backend.store.put_bytes("x.bin", b"payload")
    assert backend.names_raw() == ["x.bin", "x.bin.sha256"]
    assert backend.store.get_bytes("x.bin") == b"payload"
    # The sidecar is a plain hex digest other tools can check (sha256sum, aws s3api).
    backend.delete_raw("x.bin.sha256")
    backend.write_raw("x.bin.sha256", (sha256_hex(b"payload") + "\n").encode())
    assert backend.store.get_bytes("x.bin") == b"payload"


def test_overwrite_replaces_blob_and_checksum(store: Store) -> None:
    store.put_bytes("k", b"old")
    store.put_bytes("k", b"new!")
    assert store.get_bytes("k") == b"new!"


def test_json_round_trip_sorted_utf8(store: Store) -> None:
    doc = {"z": [1, 2.5, None, True], "a": {"ünï": "cödé ✓"}, "m": "x"}
    store.put_json("meta/doc.json", doc)
    assert store.get_json("meta/doc.json") == doc
    raw = store.get_bytes("meta/doc.json")
    assert raw.decode("utf-8").index('"a"') < raw.decode("utf-8").index('"z"')
    assert "ünï".encode() in raw  # written as UTF-8, not \u escapes


def test_json_same_object_same_bytes(store: Store) -> None:
    store.put_json("one", {"b": 1, "a": 2})
    store.put_json("two", {"a": 2, "b": 1})
    assert store.get_bytes("one") == store.get_bytes("two")


@pytest.mark.parametrize("bad", [float("nan"), {"x": float("inf")}, {1: object()}, {"s": {1, 2}}])
def test_put_json_refuses_what_json_cannot_hold(store: Store, bad: object) -> None:
    with pytest.raises(StoreError, match="cannot write 'doc' as JSON"):
        store.put_json("doc", bad)
    assert not store.exists("doc")


def test_get_json_on_non_json_blob_names_key(store: Store) -> None:
    store.put_bytes("not.json", b"\xff\x00binary")
    with pytest.raises(StoreError, match=r"'not\.json' is not UTF-8 JSON"):
        store.get_json("not.json")


def test_list_is_sorted_and_folder_scoped(store: Store) -> None:
    for key in ["b/2", "a/1", "a/10/x", "a1", "c"]:
        store.put_bytes(key, key.encode())
    assert store.list() == ["a/1", "a/10/x", "a1", "b/2", "c"]
    assert store.list("a") == ["a/1", "a/10/x"]
    assert store.list("a/") == ["a/1", "a/10/x"]
    assert store.list("a/10") == ["a/10/x"]
    assert store.list("nothing-here") == []


def test_list_of_empty_store_is_empty(store: Store) -> None:
    assert store.list() == []


def test_delete_removes_blob_and_sidecar(backend: Backend) -> None:
    store = backend.store
    store.put_bytes("d/k", b"1")
    store.put_bytes("d/keep", b"2")
    store.delete("d/k")
    assert not store.exists("d/k")
    assert store.list() == ["d/keep"]
    assert backend.names_raw() == ["d/keep", "d/keep.sha256"]
    with pytest.raises(StoreError, match="no blob at key 'd/k'"):
        store.get_bytes("d/k")


def test_delete_of_missing_key_is_quiet(store: Store) -> None:
    store.delete("never/written")


def test_missing_key_raises_store_error_naming_key(store: Store) -> None:
    assert not store.exists("nope.json")
    for read in (store.get_bytes, store.get_json, store.get_tensors):
        with pytest.raises(StoreError, match=r"no blob at key 'nope\.json'") as info:
            read("nope.json")
        assert not isinstance(info.value, IntegrityError)
        assert store.uri in str(info.value)


def test_child_is_confined_to_its_prefix(backend: Backend) -> None:
    parent = backend.store
    parent.put_bytes("secret.bin", b"provider only")
    parent.put_bytes("tenants/b/data.bin", b"tenant b only")
    child = parent.child("tenants/a")
    child.put_json("update.json", {"n": 1})

    assert child.uri == parent.uri + "/tenants/a"
    assert child.list() == ["update.json"]
    assert parent.list("tenants") == ["tenants/a/update.json", "tenants/b/data.bin"]
    assert parent.get_json("tenants/a/update.json") == {"n": 1}
    assert not child.exists("secret.bin")
    for escape in ["../b/data.bin", "../../secret.bin", "/secret.bin", "..\\b\\data.bin"]:
        with pytest.raises(StoreError):
            child.get_bytes(escape)
        with pytest.raises(StoreError):
            child.put_bytes(escape, b"overwrite attempt")
    with pytest.raises(StoreError):
        child.child("..")
    assert parent.get_bytes("tenants/b/data.bin") == b"tenant b only"
    assert parent.get_bytes("secret.bin") == b"provider only"


# Object names no key can say, planted behind the store's back in tenant b's prefix (a local
# folder cannot hold '..' or '//' names; a bucket holds any).
PLANTED = {
    "local": ["tenants/b/back\\slash", "tenants/b/ctl\x01"],
    "s3": ["tenants/b/x/../../a/update.bin", "tenants/b/../a/update.bin", "tenants/b/x//y",
           "tenants/b/./z", "tenants/b/back\\slash", "tenants/b/ctl\x01"],
}


def test_a_prefix_lists_only_keys_it_can_read(backend: Backend) -> None:
    """A planted object whose name is no valid key (a traversal such as 'x/../../a/...') is
    left out of listings, so whoever lists a tenant's prefix (the provider's --fresh, its
    pruning) is neither stopped by a key every get refuses nor led to another tenant's object."""
    parent = backend.store
    parent.put_bytes("tenants/a/update.bin", b"tenant a's update")
    b = parent.child("tenants/b")
    b.put_bytes("update.bin", b"tenant b's update")
    for name in PLANTED[backend.name]:
        backend.write_raw(name, b"planted")
        backend.write_raw(name + ".sha256", sha256_hex(b"planted").encode())

    assert b.list() == ["update.bin"]
    assert parent.list() == ["tenants/a/update.bin", "tenants/b/update.bin"]
    for key in parent.list():  # what --fresh does: every listed key can be read and deleted
        parent.get_bytes(key)
        parent.delete(key)
    assert parent.list() == []


def test_grandchild_nests(store: Store) -> None:
    store.child("a").child("b/c").put_bytes("k", b"v")
    assert store.list() == ["a/b/c/k"]
    assert store.child("a/b").list() == ["c/k"]


def test_tampered_blob_raises_integrity_error_with_both_hashes(backend: Backend) -> None:
    backend.store.put_bytes("model.bin", b"genuine weights")
    backend.write_raw("model.bin", b"tampered weights")
    with pytest.raises(IntegrityError) as info:
        backend.store.get_bytes("model.bin")
    message = str(info.value)
    assert "'model.bin'" in message
    assert sha256_hex(b"genuine weights") in message
    assert sha256_hex(b"tampered weights") in message
    # A sidecar is checked even by readers that do not require one.
    with pytest.raises(IntegrityError):
        backend.store.get_bytes("model.bin", verify=False)


def test_tampered_tensors_and_json_raise_integrity_error(backend: Backend) -> None:
    import torch

    backend.store.put_tensors("t", {"w": torch.zeros(4)})
    backend.store.put_json("j", {"ok": True})
    backend.write_raw("t", backend.store.get_bytes("j"))
    backend.write_raw("j", b'{"ok": false}')
    with pytest.raises(IntegrityError):
        backend.store.get_tensors("t")
    with pytest.raises(IntegrityError):
        backend.store.get_json("j")


def test_malformed_sidecar_raises_integrity_error(backend: Backend) -> None:
    backend.store.put_bytes("k", b"v")
    backend.write_raw("k.sha256", b"not a digest")
    with pytest.raises(IntegrityError, match="malformed"):
        backend.store.get_bytes("k")


def test_half_written_blob_is_absent(backend: Backend) -> None:
    """A crash between blob and sidecar leaves a blob that no reader trusts."""
    backend.write_raw("round-1/update.bin", b"partial")
    store = backend.store
    assert not store.exists("round-1/update.bin")
    assert store.list() == []
    with pytest.raises(StoreError, match=r"no \.sha256 checksum") as info:
        store.get_bytes("round-1/update.bin")
    assert "verify=False" in info.value.fix
    with pytest.raises(StoreError):
        store.get_json("round-1/update.bin")
    # Re-running the step that writes it completes it.
    store.put_bytes("round-1/update.bin", b"complete")
    assert store.exists("round-1/update.bin")
    assert store.list() == ["round-1/update.bin"]


def test_sidecar_without_blob_is_absent(backend: Backend) -> None:
    backend.write_raw("k.sha256", sha256_hex(b"v").encode())
    assert not backend.store.exists("k")
    assert backend.store.list() == []
    with pytest.raises(StoreError, match="no blob at key 'k'"):
        backend.store.get_bytes("k")


def test_verify_false_reads_uploaded_file_without_sidecar(backend: Backend) -> None:
    backend.write_raw("tenants/a/train.jsonl", b'{"instruction": "hi"}\n')
    assert backend.store.get_bytes("tenants/a/train.jsonl", verify=False) == (
        b'{"instruction": "hi"}\n'
    )


def test_put_bytes_refuses_non_bytes(store: Store) -> None:
    with pytest.raises(StoreError, match="data must be bytes, got str"):
        store.put_bytes("k", "text")  # type: ignore[arg-type]
    assert not store.exists("k")


def test_uri_round_trips_through_open_store(store: Store) -> None:
    from fedtune.storage import open_store

    store.put_bytes("k", b"v")
    assert open_store(store.uri).get_bytes("k") == b"v"
