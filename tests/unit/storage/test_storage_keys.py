"""Key rules: every kind of bad key is refused by every backend before any I/O."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest

from fedtune.core.errors import StoreError
from fedtune.storage import sidecar_key, validate_key, validate_prefix
from fedtune.storage.keys import join_key
from tests.helpers.stores import Backend

# (case id, key, words the error message must contain)
BAD_KEYS = [
    ("empty", "", "empty"),
    ("absolute", "/etc/passwd", "absolute"),
    ("parent", "../escape", "'..'"),
    ("parent-inside", "a/../../b", "'..'"),
    ("dot", "a/./b", "'.'"),
    ("only-dot", ".", "'.'"),
    ("double-slash", "a//b", "empty part"),
    ("trailing-slash", "a/b/", "empty part"),
    ("backslash", "a\\b", "backslash"),
    ("windows-parent", "..\\escape", "backslash"),
    ("nul", "a\x00b", "control"),
    ("newline", "a\nb", "control"),
    ("escape-char", "a\x1b[31mb", "control"),
    ("del", "a\x7fb", "control"),
    ("sidecar-suffix", "model.safetensors.sha256", "reserves"),
    ("temp-suffix", "x.fedtune-tmp", "reserves"),
    ("too-long", "k" * 1025, "longer than 1024"),
    ("not-a-string", 42, "must be a string"),
    ("none", None, "must be a string"),
]

GOOD_KEYS = [
    "a",
    "rounds/3/update.safetensors",
    ".hidden",
    "a..b/c...d",
    "name with spaces/ünïcödé.json",
    "sha256",
    "x.sha256.json",
    "k" * 1024,
]


@pytest.mark.parametrize(("key", "words"), [c[1:] for c in BAD_KEYS], ids=[c[0] for c in BAD_KEYS])
def test_validate_key_rejects_with_reason(key: object, words: str) -> None:
    with pytest.raises(StoreError, match=None) as info:
        validate_key(key)
    assert words in str(info.value)
    assert info.value.fix  # every error says what to do


@pytest.mark.parametrize("key", GOOD_KEYS)
def test_validate_key_accepts_portable_keys(key: str) -> None:
    assert validate_key(key) == key


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [("", ""), ("a", "a"), ("a/b/", "a/b"), ("tenants/t-1", "tenants/t-1")],
)
def test_validate_prefix_normalises_trailing_slash(prefix: str, expected: str) -> None:
    assert validate_prefix(prefix) == expected


@pytest.mark.parametrize("prefix", ["/", "/abs", "a//", "../x", "a/./b", "a\\b", "a\x00"])
def test_validate_prefix_rejects(prefix: str) -> None:
    with pytest.raises(StoreError):
        validate_prefix(prefix)


def test_sidecar_key_is_key_plus_suffix() -> None:
    assert sidecar_key("a/b.json") == "a/b.json.sha256"


_BAD_FOR_BACKENDS = [c for c in BAD_KEYS if c[0] not in ("too-long",)]


@pytest.mark.parametrize(
    "key", [c[1] for c in _BAD_FOR_BACKENDS], ids=[c[0] for c in _BAD_FOR_BACKENDS]
)
def test_every_operation_refuses_bad_keys_before_io(backend: Backend, key: object) -> None:
    store, bad = backend.store, cast(Any, key)
    operations: list[Callable[[], object]] = [
        lambda: store.put_bytes(bad, b"x"),
        lambda: store.get_bytes(bad),
        lambda: store.get_bytes(bad, verify=False),
        lambda: store.exists(bad),
        lambda: store.delete(bad),
        lambda: store.put_json(bad, {"a": 1}),
        lambda: store.get_json(bad),
        lambda: store.put_tensors(bad, {}),
        lambda: store.get_tensors(bad),
    ]
    for operation in operations:
        with pytest.raises(StoreError):
            operation()
    assert backend.names_raw() == []


@pytest.mark.parametrize("prefix", ["", "/", "../up", "a/../../up", "a\\b", "a//b"])
def test_child_refuses_bad_or_empty_prefix(backend: Backend, prefix: str) -> None:
    with pytest.raises(StoreError):
        backend.store.child(prefix)


def test_list_refuses_escaping_prefix(backend: Backend) -> None:
    with pytest.raises(StoreError):
        backend.store.list("../")


@pytest.mark.parametrize(
    ("prefix", "key", "joined"),
    [("", "k", "k"), ("a", "k", "a/k"), ("a/b", "", "a/b"), ("", "", "")],
)
def test_join_key(prefix: str, key: str, joined: str) -> None:
    assert join_key(prefix, key) == joined
