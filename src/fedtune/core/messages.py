"""Typed, serializable messages between phases: tensors (safetensors) plus JSON metadata.

On Kubernetes every phase is its own pod, so nothing a later phase needs may live only in
memory. A message is stored under one key as ``<key>.safetensors`` then ``<key>.json``; the
JSON is written last, so its presence marks a complete message (that is what resume checks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from fedtune.core.errors import IntegrityError

if TYPE_CHECKING:
    import torch

    from fedtune.storage.base import Store

M = TypeVar("M", bound="Message")


@dataclass
class Message:
    """Named tensors plus JSON-serializable metadata."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def save(self, store: Store, key: str) -> int:
        """Write the message; return the bytes written (tensors and metadata)."""
        written = store.put_tensors(f"{key}.safetensors", self.tensors)
        return written + store.put_json(f"{key}.json", self.meta)

    @classmethod
    def load(cls: type[M], store: Store, key: str) -> M:
        """Read a message written by :meth:`save` (checksums verified).

        Raises:
            IntegrityError: A half fails its checksum; the fix names the exact command that
                removes the whole message (both halves and their sidecars), after which
                the step that wrote it runs again on ``--resume``.
        """
        try:
            meta = store.get_json(f"{key}.json")
            return cls(tensors=store.get_tensors(f"{key}.safetensors"), meta=meta)
        except IntegrityError as exc:
            # Removing only the damaged half is not enough: the JSON half alone still
            # marks the message (and its step) as done.
            command = store.removal_command([f"{key}.safetensors", f"{key}.json"])
            raise IntegrityError(
                str(exc),
                fix=f"Remove the whole message so the step that wrote it runs again: `{command}`; "
                "then run the same command with --resume.",
            ) from exc

    @staticmethod
    def stored(store: Store, key: str) -> bool:
        """True when a complete message is stored under ``key``."""
        return store.exists(f"{key}.json") and store.exists(f"{key}.safetensors")

    def group(self, prefix: str) -> dict[str, torch.Tensor]:
        """The tensors under ``prefix/``, with the prefix removed."""
        head = prefix + "/"
        return {k[len(head) :]: v for k, v in self.tensors.items() if k.startswith(head)}

    @property
    def nbytes(self) -> int:
        """Raw bytes of the tensors (without container overhead)."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def prefixed(prefix: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Namespace a state dict under ``prefix/`` so several can share one message."""
    return {f"{prefix}/{k}": v for k, v in tensors.items()}


class ServerState(Message):
    """The provider's state after a phase (e.g. the global adapter, optimizer moments)."""


class Broadcast(Message):
    """What the provider sends every sampled tenant at the start of a round."""


class Update(Message):
    """What one tenant sends back: tensors plus ``num_samples`` and metrics in ``meta``."""


@dataclass
class ClientState(Message):
    """What a tenant keeps between rounds in its own store (e.g. a control variate).

    ``files`` are extra documents for the tenant to read (e.g. FewFedPIT's synthetic data as
    JSONL), by key in the tenant's store; the engine writes them before the state and never
    prunes them. They are not read back by :meth:`load`.
    """

    files: dict[str, bytes] = field(default_factory=dict)
