"""Encodings of what stores hold: JSON documents and safetensors blobs, as bytes.

Both formats are data only, so a blob written by another party can be read without running
its code (no pickle across a trust boundary). torch and safetensors are imported by the tensor
functions only: steps that read and write JSON alone start without them.
"""

from __future__ import annotations

import json
import struct
from typing import TYPE_CHECKING, Any

from fedtune.core.errors import StoreError

if TYPE_CHECKING:
    import torch

    from fedtune.storage.base import Store

_HEADER_LEN = struct.Struct("<Q")


def encode_json(obj: Any, *, key: str) -> bytes:
    """Serialize ``obj`` as UTF-8 JSON with sorted keys, so equal objects give equal bytes.

    NaN and infinities are refused: they are not JSON, and readers in other languages fail on
    them long after the writer is gone.
    """
    try:
        text = json.dumps(obj, sort_keys=True, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StoreError(
            f"cannot write {key!r} as JSON: {exc}",
            fix="Pass only dicts with string keys, lists, strings, finite numbers, booleans "
            "and None; turn NaN/inf into null or a string first.",
        ) from exc
    return text.encode("utf-8")


def decode_json(data: bytes, *, key: str) -> Any:
    """Parse a UTF-8 JSON document read from ``key``."""
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise StoreError(
            f"blob {key!r} is not UTF-8 JSON: {exc}",
            fix="Read it with get_bytes, or rewrite it with put_json.",
        ) from exc


def encode_tensors(
    tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None, *, key: str
) -> bytes:
    """Serialize tensors (any layout) and string metadata as one safetensors blob."""
    import torch
    from safetensors.torch import save as _st_save

    if not isinstance(tensors, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in tensors.items()
    ):
        raise StoreError(
            f"cannot write {key!r}: tensors must be a dict of str -> torch.Tensor, "
            f"got {_describe(tensors)}",
            fix="Pass a state dict such as {'layer.weight': tensor}.",
        )
    if metadata is not None and (
        not isinstance(metadata, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        raise StoreError(
            f"cannot write {key!r}: metadata must be a dict of str -> str, "
            f"got {_describe(metadata)}",
            fix="Turn metadata values into strings (json.dumps for structures).",
        )
    try:
        return bytes(_st_save(_savable(tensors), metadata=metadata))
    except Exception as exc:  # safetensors raises several unrelated types
        raise StoreError(
            f"cannot write {key!r} as safetensors: {exc}",
            fix="Pass dense tensors that hold data (to_dense() sparse ones, dequantize() "
            "quantized ones, materialise meta ones).",
        ) from exc


def _savable(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU tensors that safetensors accepts, copying only those it would refuse.

    safetensors refuses non-contiguous views and tensors that share storage (tied weights,
    slices of one buffer); a contiguous clone of those is always accepted. The others are
    passed as they are so a large state is not held twice in memory.
    """
    import torch

    cpu = {name: t.detach().to("cpu") for name, t in tensors.items()}
    users: dict[int, int] = {}
    for t in cpu.values():
        if t.numel():
            ptr = t.untyped_storage().data_ptr()
            users[ptr] = users.get(ptr, 0) + 1
    return {
        name: t
        if t.is_contiguous() and (not t.numel() or users[t.untyped_storage().data_ptr()] == 1)
        else t.clone(memory_format=torch.contiguous_format)
        for name, t in cpu.items()
    }


def decode_tensors(data: bytes, *, key: str) -> dict[str, torch.Tensor]:
    """Parse a safetensors blob read from ``key`` into CPU tensors."""
    from safetensors.torch import load as _st_load

    try:
        return _st_load(data)
    except Exception as exc:  # SafetensorError, or OverflowError/ValueError on garbage
        raise StoreError(
            f"blob {key!r} is not a safetensors file: {exc}",
            fix="Read it with get_bytes, or rewrite it with put_tensors.",
        ) from exc


def decode_tensor_metadata(data: bytes, *, key: str) -> dict[str, str]:
    """Return the ``__metadata__`` of a safetensors blob (``{}`` when it has none).

    The header is an 8-byte little-endian length followed by that many bytes of JSON, so the
    metadata can be read without materialising the tensors.
    """
    try:
        (length,) = _HEADER_LEN.unpack_from(data, 0)
        header = json.loads(data[_HEADER_LEN.size : _HEADER_LEN.size + length].decode("utf-8"))
        meta = header.get("__metadata__", {}) if isinstance(header, dict) else None
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise StoreError(
            f"blob {key!r} has no readable safetensors header: {exc}",
            fix="Rewrite it with put_tensors.",
        ) from exc
    if not isinstance(meta, dict):
        raise StoreError(
            f"blob {key!r} has a malformed safetensors header", fix="Rewrite it with put_tensors."
        )
    return {str(k): str(v) for k, v in meta.items()}


def _describe(value: object) -> str:
    """A short description of a wrongly typed argument for an error message."""
    if isinstance(value, dict):
        kinds = {f"{type(k).__name__} -> {type(v).__name__}" for k, v in value.items()}
        return "dict of " + ", ".join(sorted(kinds)) if kinds else "empty dict"
    return type(value).__name__


def get_tensors_with_metadata(
    store: Store, key: str
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Read a verified safetensors blob from ``store`` with the metadata it was written with."""
    data = store.get_bytes(key)
    return decode_tensors(data, key=key), decode_tensor_metadata(data, key=key)
