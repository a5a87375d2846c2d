"""Dataset files other than JSON Lines, read through the ``datasets`` library.

Which reader a dataset gets is decided by its name:

| data URI                         | read as                                              |
|----------------------------------|------------------------------------------------------|
| ``*.json``                       | a JSON array of records (or JSON Lines)              |
| ``*.csv``                        | CSV with a header row; every cell is text            |
| ``*.parquet``                    | Parquet                                              |
| a name without an extension      | a folder written by ``Dataset.save_to_disk``, when   |
|                                  | ``<uri>/state.json`` exists                          |
| anything else (``*.jsonl``, ...) | JSON Lines, streamed as before (:mod:`.jsonl`)       |

A ``save_to_disk`` folder is several blobs under one prefix: the URI names the folder, and
only ``state.json`` and the ``*.arrow`` files it lists are read, each key checked to be a
plain file name, so a tenant's folder never reaches outside its own prefix. The folder's
other settings (format, fingerprint) are not used: rows are read from the Arrow files. A
``DatasetDict`` folder names its splits; point the URI at one of them. CSV cells are read
as text, never converted to numbers, so an answer ``"42"`` stays the string the model
learns. Every file is copied to a temporary folder first: Parquet and Arrow need to seek.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any, Final

from fedtune.core.errors import DataError, StoreError, StoreUnavailable

__all__ = ["FOLDER", "kind_of", "read_rows"]

logger = logging.getLogger(__name__)

FOLDER: Final = "datasets folder"
_FILES: Final = {".json": "json", ".csv": "csv", ".parquet": "parquet"}
_STATE: Final = "state.json"
_SPLITS: Final = "dataset_dict.json"
_ARROW_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\.arrow")


def _get(store: Any, key: str) -> bytes | None:
    """The blob at ``key``, or ``None`` when there is none (an outage still raises)."""
    try:
        return bytes(store.get_bytes(key, verify=False))
    except StoreUnavailable:
        raise
    except StoreError:
        return None


def kind_of(store: Any, key: str) -> str | None:
    """``json``, ``csv``, ``parquet`` or :data:`FOLDER` for ``key`` in ``store``; ``None``
    for JSON Lines. Only a key without an extension costs a lookup (of its ``state.json``)."""
    suffix = PurePosixPath(key).suffix.lower()
    if suffix in _FILES:
        return _FILES[suffix]
    if suffix:
        return None
    if _get(store, f"{key}/{_STATE}") is not None or _get(store, f"{key}/{_SPLITS}") is not None:
        return FOLDER
    return None


def _copy(store: Any, key: str, dest: Path) -> Path:
    with store.reading(key) as stream, open(dest, "wb") as out:
        shutil.copyfileobj(stream, out)
    return dest


@contextmanager
def _quiet_datasets() -> Iterator[Any]:
    import datasets

    # Progress bars and "Generating train split" lines are noise in a tenant's log.
    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    level = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity_error()
    try:
        yield datasets
    finally:
        datasets.logging.set_verbosity(level)
        if was_enabled:
            datasets.enable_progress_bars()


def _read_file(store: Any, key: str, uri: str, kind: str, tmp: Path) -> Any:
    local = _copy(store, key, tmp / f"data.{kind}")
    with _quiet_datasets() as datasets:
        options: dict[str, Any] = {"cache_dir": str(tmp / "cache"), "keep_in_memory": True}
        if kind == "csv":
            header = _csv_header(local, uri)
            text = datasets.Value("string")
            options.update(features=datasets.Features(dict.fromkeys(header, text)), keep_default_na=False)
        reader = {"json": datasets.Dataset.from_json, "csv": datasets.Dataset.from_csv,
                  "parquet": datasets.Dataset.from_parquet}[kind]
        try:
            return reader(str(local), **options)
        except Exception as exc:  # noqa: BLE001 (pyarrow, pandas and datasets each raise their own)
            cause = exc.__cause__ or exc  # DatasetGenerationError says only "an error occurred"
            raise DataError(
                f"{uri}: cannot read it as {kind.upper()}: {type(cause).__name__}: {str(cause)[:200]}",
                fix=f"Check that the file is valid {kind.upper()} (a {kind} file ends in "
                f".{kind}); JSON Lines files should end in .jsonl.",
            ) from exc


def _csv_header(path: Path, uri: str) -> list[str]:
    import csv

    with open(path, encoding="utf-8-sig", newline="") as handle:
        try:
            header = next(csv.reader(handle), [])
        except (csv.Error, UnicodeDecodeError) as exc:
            raise DataError(
                f"{uri}: cannot read the CSV header: {exc}",
                fix="Save the file as UTF-8 CSV with a header row naming the fields.",
            ) from exc
    if not header or len(set(header)) != len(header) or not all(header):
        raise DataError(
            f"{uri}: the CSV header must name each column once, got {header!r}",
            fix="Put one header row first, e.g. instruction,input,output.",
        )
    return header


def _read_folder(store: Any, key: str, uri: str, tmp: Path) -> Any:
    splits = _get(store, f"{key}/{_SPLITS}")
    if splits is not None:
        names = _json(splits, f"{uri}/{_SPLITS}").get("splits", [])
        raise DataError(
            f"{uri} is a DatasetDict folder with splits {names}; a tenant's data is one split",
            fix=f"Point the URI at one split's folder, e.g. {uri.rstrip('/')}/{names[0] if names else 'train'}.",
        )
    state = _json(_get(store, f"{key}/{_STATE}") or b"", f"{uri}/{_STATE}")
    files = state.get("_data_files")
    names = [f.get("filename") if isinstance(f, dict) else f for f in files or []]
    bad = [n for n in names if not isinstance(n, str) or not _ARROW_NAME.fullmatch(n)]
    if not names or bad:
        raise DataError(
            f"{uri}/{_STATE}: _data_files must list the folder's .arrow file names, got "
            f"{(bad or names)!r}"[:300],
            fix="Write the folder with datasets' Dataset.save_to_disk and upload it unchanged.",
        )
    with _quiet_datasets() as datasets:
        parts = []
        for name in names:
            try:
                local = _copy(store, f"{key}/{name}", tmp / name)
                parts.append(datasets.Dataset.from_file(str(local), in_memory=True))
            except StoreUnavailable:
                raise
            except (StoreError, OSError, ValueError) as exc:
                raise DataError(
                    f"{uri}: cannot read {name} listed in {_STATE}: {str(exc)[:200]}",
                    fix="Upload every file that Dataset.save_to_disk wrote, unchanged.",
                ) from exc
        return datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]


def _json(data: bytes, shown: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(
            f"{shown} is not valid JSON: {exc}",
            fix="Write the folder with datasets' Dataset.save_to_disk and upload it unchanged.",
        ) from exc
    if not isinstance(value, dict):
        raise DataError(f"{shown} must hold a JSON object, got {type(value).__name__}",
                        fix="Write the folder with datasets' Dataset.save_to_disk.")
    return value


def read_rows(
    store: Any, key: str, uri: str, kind: str, *, max_record_bytes: int | None = None
) -> list[tuple[int, dict[str, Any]]]:
    """``(row number from 1, record)`` for every row of the dataset at ``key``.

    A row whose JSON form is longer than ``max_record_bytes`` is skipped with a warning, as
    a JSON Lines line would be.

    Raises:
        DataError: The file cannot be parsed as ``kind``, or the folder is incomplete.
        StoreError: A blob cannot be read.
    """
    with tempfile.TemporaryDirectory(prefix="fedtune-data-") as name:
        tmp = Path(name)
        table = _read_folder(store, key, uri, tmp) if kind == FOLDER else _read_file(store, key, uri, kind, tmp)
        rows: list[tuple[int, dict[str, Any]]] = []
        for number, row in enumerate(table, start=1):
            size = len(json.dumps(row, ensure_ascii=False, default=str).encode())
            if max_record_bytes is not None and size > max_record_bytes:
                logger.warning(
                    "%s, row %d: record of %d bytes exceeds limits.max_record_bytes=%d; skipped",
                    uri, number, size, max_record_bytes,
                )
                continue
            rows.append((number, row))
        return rows
