"""A store in a local folder (``file://``): what the local engine and tests use as a bucket."""

from __future__ import annotations

import logging
import os
import secrets
import shlex
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO, Literal

from fedtune.core.errors import StoreError
from fedtune.storage.blobstore import BlobStore
from fedtune.storage.keys import TEMP_SUFFIX, join_key

logger = logging.getLogger(__name__)


class LocalStore(BlobStore):
    """Blobs as files under a root folder; keys map to relative paths.

    The root need not exist yet: it is created on the first write.

    Args:
        root: Absolute (or relative, taken from the working directory) folder of the store.
        prefix: Sub-folder this store is confined to; used by :meth:`child`.
    """

    def __init__(self, root: str | os.PathLike[str], prefix: str = "") -> None:
        super().__init__(prefix)
        # abspath also folds '..' so URIs and error messages show the real folder.
        self._root = Path(os.path.abspath(root))
        self._base = self._root.joinpath(*self._prefix.split("/")) if self._prefix else self._root

    @property
    def uri(self) -> str:
        """``file://`` URI of the folder this store is confined to."""
        return self._base.as_uri()

    @property
    def path(self) -> Path:
        """The folder this store is confined to."""
        return self._base

    def _path(self, name: str, *, replace: bool = False) -> Path:
        """The file of ``name``, refused when it resolves outside this store's own folder.

        Keys cannot say '..', but a symbolic link planted inside the folder (a tenant's
        update linked to a file elsewhere, or to another tenant's prefix) could still lead
        out of it. The folder is the resolved root joined with the literal prefix, so a
        linked prefix folder is refused too. ``replace`` (a write's rename, a delete): only the
        parent must stay inside, since both replace or remove a link itself, never its target.
        """
        path = self._root.joinpath(*name.split("/"))
        folder = self._root.resolve().joinpath(*self._prefix.split("/") if self._prefix else ())
        resolved = (path.parent if replace else path).resolve()
        if not resolved.is_relative_to(folder):
            key = name[len(self._prefix) + 1 :] if self._prefix else name
            link = _first_link(self._root, path)
            how = "is a symbolic link" if link == path else f"lies under the symbolic link {link}"
            raise StoreError(
                f"key {key!r} of {self.uri} is refused: it {how} that leads to {resolved}, "
                f"outside this store's folder",
                fix="fedtune never writes symbolic links, so whoever can write the store planted "
                f"it: remove it (`rm {shlex.quote(str(link))}`) and ask why it was there.",
            )
        return path

    @contextmanager
    def _os_errors(self, action: str, path: Path) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            raise StoreError(
                f"cannot {action} {path}: {exc.strerror or exc}",
                fix="Check that the store folder exists or can be created, is writable, "
                "and that no key is both a file and a folder.",
            ) from exc

    def _write(self, name: str, data: bytes) -> None:
        path = self._path(name, replace=True)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}{TEMP_SUFFIX}")
        with self._os_errors("write", path):
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                # Temp file in the same folder so os.replace is a rename on one filesystem,
                # which POSIX makes atomic; fsync first so the rename never exposes a file
                # whose bytes are still only in the page cache.
                with open(tmp, "xb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            _fsync_dir(path.parent)

    def _read(self, name: str) -> bytes | None:
        path = self._path(name)
        with self._os_errors("read", path):
            try:
                return path.read_bytes()
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                # Missing, or the key is a folder, or one of its parents is a file: in every
                # case there is no blob at this key, as S3 would say.
                return None

    def _open(self, name: str) -> BinaryIO | None:
        path = self._path(name)
        with self._os_errors("read", path):
            try:
                return open(path, "rb")  # noqa: SIM115 (closed by BlobStore.reading)
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                return None

    def _copy_within(self, name: str, dst: BlobStore, dst_name: str) -> bool:
        """A hard link where both folders are on one filesystem. Every write here replaces a
        file by rename and none writes into one, so a later write through either name
        leaves the other's bytes as they were."""
        if not isinstance(dst, LocalStore):
            return False
        source, target = self._path(name), dst._path(dst_name)
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}{TEMP_SUFFIX}")
        with dst._os_errors("write", target):
            target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, tmp)
        except OSError:  # another filesystem, no hard links there, or no source: copy instead
            return False
        with dst._os_errors("write", target):
            try:
                os.replace(tmp, target)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            _fsync_dir(target.parent)
        return True

    def _has(self, name: str) -> bool:
        return self._path(name).is_file()

    def _remove(self, name: str) -> None:
        path = self._path(name, replace=True)
        with self._os_errors("delete", path), suppress(FileNotFoundError, NotADirectoryError):
            path.unlink()

    def _names(self, prefix: str) -> list[str]:
        top = self._root.joinpath(*prefix.split("/")) if prefix else self._root
        if not top.is_dir():
            return []
        names: list[str] = []
        with self._os_errors("list", top):
            for folder, _dirs, files in os.walk(top):
                rel = Path(folder).relative_to(self._root).as_posix()
                for file in files:
                    if not file.endswith(TEMP_SUFFIX):
                        names.append(join_key("" if rel == "." else rel, file))
        return names

    def _child(self, prefix: str) -> LocalStore:
        return LocalStore(self._root, prefix)

    def _presign(self, name: str, method: Literal["get", "put"], expires_s: int) -> str:
        raise StoreError(
            f"a local store ({self.uri}) cannot issue pre-signed URLs (asked for {name!r})",
            fix="Pre-signed URLs need an s3:// store; with a local store, open the store "
            "directly from the process that reads or writes.",
        )


def _first_link(root: Path, path: Path) -> Path:
    """The outermost symbolic link on ``path`` below ``root`` (``path`` itself if none is)."""
    rel = path.relative_to(root)
    for step in [*list(reversed(rel.parents))[1:], rel]:
        if (root / step).is_symlink():
            return root / step
    return path


def _fsync_dir(folder: Path) -> None:
    """Persist a rename in ``folder`` (POSIX); silently skipped where folders can't be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        logger.debug("fsync of folder %s not supported", folder)
    finally:
        os.close(fd)
