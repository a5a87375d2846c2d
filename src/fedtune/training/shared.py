"""What the simulated tenants of one process share, and how one tenant's traces are wiped.

The local engine runs several tenants in one process (itself, or a worker of its pool). They
share what each of them may read anyway, loaded once; the one trained thing in it, the LoRA
wrapper's adapter, is reset between tenants (:meth:`SharedBase.serve`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class SharedBase:
    """What the simulated tenants of one process share: the frozen tenant-readable base.

    In the local engine several tenants run in one process (or one worker); the base they may
    all read (a tiny config or ``model.tenant_uri``), its tokenizer, its LoRA wrapper and the
    public set of an algorithm that shares one are loaded once, like a public download. The
    wrapper's LoRA weights are the one trained thing in here: :meth:`serve` resets them to
    their seeded initial values, with gradients and optimizer leftovers dropped, and evicts a
    tenant's *own* model (FedMKT's, which is that tenant's alone), whenever another tenant's
    step begins. Nothing of one tenant is then reachable from the next tenant's step.
    """

    def __init__(self) -> None:
        self.cache: dict[str, Any] = {}
        self.tenant: str | None = None  # whose step the shared things last served

    def serve(self, tenant: str | None) -> None:
        """Hand the shared things to ``tenant`` (None: to nobody, between steps), wiping what
        another tenant left in them."""
        if tenant == self.tenant:
            return
        if self.tenant is not None:
            self._wipe()
        self.tenant = tenant

    def _wipe(self) -> None:
        for key, entry in list(self.cache.items()):
            if entry.get("owner") is not None:  # a tenant's own model: not shared, drop it
                del self.cache[key]
            elif "peft" in entry:
                reset_adapter(entry["peft"], entry["peft-init"])


def reset_adapter(model: Any, initial: Mapping[str, torch.Tensor]) -> None:
    """Put ``model``'s LoRA weights back to ``initial`` in place and drop every gradient and
    per-example gradient (Opacus's ``grad_sample``) its parameters carry."""
    from fedtune.models import lora as lora_helpers

    lora_helpers.set_adapter_state(model, dict(initial))
    for param in model.parameters():
        param.grad = None
        for name in [k for k, v in vars(param).items() if _holds_tensor(v)]:
            delattr(param, name)
    model.eval()


def _holds_tensor(value: Any) -> bool:
    import torch

    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (list, tuple)):
        return any(isinstance(v, torch.Tensor) for v in value)
    return False
