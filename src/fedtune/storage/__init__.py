"""Atomic, checksummed, prefix-confined blob stores chosen by URI (``file://``, ``s3://``).

Typical use::

    store = open_store("s3://fedtune/runs/42")          # or a local folder
    store.child("tenants/a").put_tensors("round-1/update.safetensors", state)
    data = read_object("s3://tenant-a/data/train.jsonl")  # a file a person uploaded
"""

from fedtune.storage.base import Store
from fedtune.storage.codec import get_tensors_with_metadata
from fedtune.storage.keys import sidecar_key, validate_key, validate_prefix
from fedtune.storage.local import LocalStore
from fedtune.storage.s3 import ENDPOINT_ENV, S3Store
from fedtune.storage.uri import open_store, read_object, split_object_uri

__all__ = [
    "ENDPOINT_ENV",
    "LocalStore",
    "S3Store",
    "Store",
    "get_tensors_with_metadata",
    "open_store",
    "read_object",
    "sidecar_key",
    "split_object_uri",
    "validate_key",
    "validate_prefix",
]
