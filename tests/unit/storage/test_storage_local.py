"""Local-folder specifics: temp-file writes, crash leftovers, symlinks, file/folder clashes."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from fedtune.core.errors import StoreError
from fedtune.storage import LocalStore, open_store
from fedtune.storage.keys import SIDECAR_SUFFIX, TEMP_SUFFIX


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_opening_creates_nothing_and_first_write_creates_folders(tmp_path: Path) -> None:
    root = tmp_path / "not" / "yet"
    store = open_store(str(root))
    assert not root.exists()
    assert store.list() == []
    store.put_bytes("a/b/c.bin", b"v")
    assert _files(root) == ["a/b/c.bin", "a/b/c.bin.sha256"]


def test_writes_leave_no_temp_files(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    for i in range(3):
        store.put_bytes("k", str(i).encode())
    assert _files(tmp_path) == ["k", "k.sha256"]


def test_crash_leftover_temp_file_is_invisible(tmp_path: Path) -> None:
    """A writer killed before os.replace leaves only a temp file: nothing is visible."""
    store = LocalStore(tmp_path)
    (tmp_path / f".update.bin.0123abcd{TEMP_SUFFIX}").write_bytes(b"half")
    assert store.list() == []
    assert not store.exists("update.bin")
    store.put_bytes("update.bin", b"full")
    assert store.list() == ["update.bin"]


def test_failed_write_raises_store_error_and_leaves_no_temp(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put_bytes("a", b"file")
    with pytest.raises(StoreError, match="cannot write") as info:
        store.put_bytes("a/b", b"needs 'a' to be a folder")
    assert "both a file and a folder" in info.value.fix
    assert _files(tmp_path) == ["a", "a.sha256"]
    assert not store.exists("a/b")
    with pytest.raises(StoreError, match="no blob at key 'a/b'"):
        store.get_bytes("a/b")


def test_folder_is_not_a_blob(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put_bytes("a/b", b"v")
    assert not store.exists("a")
    with pytest.raises(StoreError, match="no blob at key 'a'"):
        store.get_bytes("a", verify=False)
    with pytest.raises(StoreError, match="cannot write"):
        store.put_bytes("a", b"a folder is in the way")
    assert store.get_bytes("a/b") == b"v"


def test_relative_root_is_made_absolute_and_normalised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    store = LocalStore("../runs/./1")
    assert store.path == tmp_path / "runs" / "1"


def test_symlink_out_of_the_store_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"not yours")
    root = tmp_path / "store"
    root.mkdir()
    os.symlink(outside, root / "link")
    store = LocalStore(root)
    with pytest.raises(StoreError, match="lies under the symbolic link .*outside this store's folder"):
        store.get_bytes("link/secret", verify=False)
    with pytest.raises(StoreError, match="outside this store's folder"):
        store.put_bytes("link/planted", b"x")
    assert _files(outside) == ["secret"]


def test_a_child_store_refuses_links_out_of_its_own_prefix(tmp_path: Path) -> None:
    """A tenant's prefix is the boundary, not the store root: a link from tenant b's prefix
    to tenant a's file (inside the root) is refused, as is a linked prefix folder."""
    root = LocalStore(tmp_path / "exchange")
    root.put_bytes("tenants/a/update.bin", b"tenant a's update")
    a_file = root.path / "tenants" / "a" / "update.bin"
    b_dir = root.path / "tenants" / "b"
    b_dir.mkdir(parents=True)
    os.symlink(a_file, b_dir / "update.bin")
    os.symlink(str(a_file) + SIDECAR_SUFFIX, b_dir / ("update.bin" + SIDECAR_SUFFIX))
    assert root.get_bytes("tenants/b/update.bin") == b"tenant a's update"  # the root spans both
    b = root.child("tenants/b")
    for read in (lambda: b.get_bytes("update.bin"), lambda: b.exists("update.bin")):
        with pytest.raises(StoreError, match=r"key 'update.bin(.sha256)?' .* is refused: it is a symbolic link"):
            read()
    os.symlink(root.path / "tenants" / "a", root.path / "tenants" / "c")
    with pytest.raises(StoreError, match="lies under the symbolic link .*tenants/c "):
        root.child("tenants/c").get_bytes("update.bin")
    # Deleting a planted link removes the link, never what it points to; a write replaces it.
    b.delete("update.bin")
    assert not (b_dir / "update.bin").is_symlink() and a_file.read_bytes() == b"tenant a's update"
    os.symlink(a_file, b_dir / "update.bin")
    b.put_bytes("update.bin", b"tenant b's own")
    assert not (b_dir / "update.bin").is_symlink() and b.get_bytes("update.bin") == b"tenant b's own"
    assert root.get_bytes("tenants/a/update.bin") == b"tenant a's update"


def test_child_path_and_uri(tmp_path: Path) -> None:
    child = LocalStore(tmp_path).child("tenants/a")
    assert isinstance(child, LocalStore)
    assert child.path == tmp_path / "tenants" / "a"
    assert child.uri == (tmp_path / "tenants" / "a").as_uri()


class _ReadDuringBlobWrite(LocalStore):
    """A local store that runs ``during`` once, just before it replaces a blob: a reader (or
    another writer) that comes at the worst moment of a write."""

    during: Callable[[], None] | None = None

    def _write(self, name: str, data: bytes) -> None:
        if self.during is not None and not name.endswith(SIDECAR_SUFFIX):
            during, self.during = self.during, None
            during()
        super()._write(name, data)


def test_rewriting_the_same_bytes_never_hides_the_checksum_from_readers(tmp_path: Path) -> None:
    """Two KFP tasks publishing one deterministic message at once (the per-tenant final steps
    both writing the final broadcast) made one task's read fail with "no .sha256 checksum":
    the second writer took the sidecar away while it rewrote identical bytes."""
    first = LocalStore(str(tmp_path))
    first.put_bytes("final/broadcast.json", b'{"round": 8}')
    second = _ReadDuringBlobWrite(str(tmp_path))
    seen: list[bytes] = []
    second.during = lambda: seen.append(first.get_bytes("final/broadcast.json"))
    second.put_bytes("final/broadcast.json", b'{"round": 8}')
    assert first.get_bytes("final/broadcast.json") == b'{"round": 8}'
    assert seen in ([], [b'{"round": 8}'])  # never the missing-checksum StoreError


def test_a_writer_that_found_no_checksum_leaves_a_finished_writers_one(tmp_path: Path) -> None:
    """Writer B reads "no sidecar", writer A then finishes the same message, B goes on: B must
    not remove A's sidecar while A's reader reads."""
    writer_a = LocalStore(str(tmp_path))
    writer_b = _ReadDuringBlobWrite(str(tmp_path))
    read: list[bytes] = []

    def a_finishes_and_reads() -> None:
        writer_a.put_bytes("k.json", b"same")
        read.append(writer_a.get_bytes("k.json"))

    writer_b.during = a_finishes_and_reads
    writer_b.put_bytes("k.json", b"same")
    assert read == [b"same"] and writer_a.get_bytes("k.json") == b"same"


def test_new_bytes_still_hide_the_old_checksum_while_the_blob_is_replaced(tmp_path: Path) -> None:
    """Different content: a reader in the middle sees the key as incomplete, never the new blob
    against the old checksum."""
    plain = LocalStore(str(tmp_path))
    plain.put_bytes("k.json", b"old")
    store = _ReadDuringBlobWrite(str(tmp_path))
    errors: list[str] = []

    def read() -> None:
        try:
            plain.get_bytes("k.json")
        except StoreError as exc:
            errors.append(str(exc))

    store.during = read
    store.put_bytes("k.json", b"new")
    assert len(errors) == 1 and "no .sha256 checksum" in errors[0]
    assert plain.get_bytes("k.json") == b"new"
