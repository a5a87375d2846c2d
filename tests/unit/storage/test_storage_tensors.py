"""Tensors through both backends: dtypes, odd layouts, shared storage, metadata."""

from __future__ import annotations

import pytest
import torch

from fedtune.core.errors import StoreError
from fedtune.storage import Store, get_tensors_with_metadata
from fedtune.storage.codec import decode_tensor_metadata


def _assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype, name
        assert torch.equal(got[name], tensor), name


def test_tensors_round_trip_with_metadata(store: Store) -> None:
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "lora_A.weight": torch.randn(4, 8, generator=gen),
        "lora_B.weight": torch.randn(8, 4, generator=gen).to(torch.bfloat16),
        "ids": torch.tensor([3, 1, 2], dtype=torch.int32),
        "scalar": torch.tensor(1.5, dtype=torch.float64),
        "half": torch.tensor([0.5, -2.0], dtype=torch.float16),
        "mask": torch.tensor([True, False]),
        "empty": torch.zeros(0, 3),
    }
    metadata = {"round": "3", "tenant": "a", "format": "peft-lora"}
    written = store.put_tensors("rounds/3/update.safetensors", tensors, metadata)
    assert written == len(store.get_bytes("rounds/3/update.safetensors"))
    _assert_same(store.get_tensors("rounds/3/update.safetensors"), tensors)
    got, meta = get_tensors_with_metadata(store, "rounds/3/update.safetensors")
    _assert_same(got, tensors)
    assert meta == metadata


def test_tensors_without_metadata_have_empty_metadata(store: Store) -> None:
    store.put_tensors("t", {"w": torch.ones(2)})
    assert get_tensors_with_metadata(store, "t")[1] == {}


def test_non_contiguous_and_shared_tensors_save(store: Store) -> None:
    """Transposes, strided slices and tied weights are saved as their values."""
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    tensors = {
        "transposed": base.T,
        "strided": base[:, ::2],
        "row": base[1],  # contiguous, but shares storage with "base"
        "base": base,
        "tied_a": base[2:4],
        "expanded": torch.ones(3, 1).expand(3, 5),
    }
    store.put_tensors("odd.safetensors", tensors)
    got = store.get_tensors("odd.safetensors")
    _assert_same(got, {k: v.contiguous() for k, v in tensors.items()})
    got["base"][0, 0] = 100.0  # loaded tensors are independent copies
    assert got["row"][0] == 6.0
    assert base[0, 0] == 0.0  # and saving did not touch the caller's tensors


def test_requires_grad_tensors_save(store: Store) -> None:
    param = torch.nn.Parameter(torch.ones(3))
    store.put_tensors("p", {"p": param * 2})
    assert torch.equal(store.get_tensors("p")["p"], torch.full((3,), 2.0))


@pytest.mark.parametrize(
    ("tensors", "metadata", "words"),
    [
        ({"w": [1.0, 2.0]}, None, "str -> list"),
        ({1: torch.ones(1)}, None, "int -> Tensor"),
        ("not a dict", None, "got str"),
        ({"w": torch.ones(1)}, {"round": 3}, "metadata must be a dict of str -> str"),
    ],
    ids=["list-value", "int-name", "not-dict", "int-metadata"],
)
def test_put_tensors_refuses_wrong_types(
    store: Store, tensors: object, metadata: object, words: str
) -> None:
    with pytest.raises(StoreError, match="cannot write 'k'") as info:
        store.put_tensors("k", tensors, metadata)  # type: ignore[arg-type]
    assert words in str(info.value)
    assert not store.exists("k")


def test_put_tensors_refuses_sparse_and_meta_tensors(store: Store) -> None:
    for tensor in (torch.eye(2).to_sparse(), torch.zeros(2, device="meta")):
        with pytest.raises(StoreError, match="cannot write 'k' as safetensors") as info:
            store.put_tensors("k", {"w": tensor})
        assert "to_dense()" in info.value.fix
    assert not store.exists("k")


def test_get_tensors_on_non_safetensors_blob_names_key(store: Store) -> None:
    store.put_json("doc.json", {"not": "tensors"})
    with pytest.raises(StoreError, match=r"'doc\.json' is not a safetensors file"):
        store.get_tensors("doc.json")
    with pytest.raises(StoreError, match=r"'doc\.json' is not a safetensors file"):
        get_tensors_with_metadata(store, "doc.json")


@pytest.mark.parametrize(
    "data",
    [b"", b"\x01", b"\x10\x00\x00\x00\x00\x00\x00\x00{bad json", b"\x02" + b"\x00" * 7 + b"[]"],
)
def test_metadata_of_garbage_header_is_store_error(data: bytes) -> None:
    with pytest.raises(StoreError, match=r"'k'.*safetensors header"):
        decode_tensor_metadata(data, key="k")
