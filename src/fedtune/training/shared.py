"""What the simulated tenants of one process share, and how one tenant's traces are wiped.

The local engine runs several tenants in one process (itself, or a worker of its pool). They
share what each of them may read anyway, loaded once; the one trained thing in it, the LoRA
wrapper's adapter, is reset between steps (:meth:`SharedBase.serve`). A tenant's own model
(FedMKT's small model) stays for that tenant's next step in this process, its adapter reset
too, and goes when the process serves another tenant.
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
    their seeded initial values, with gradients and optimizer leftovers dropped, when a step
    ends. A tenant's *own* model (FedMKT's, that tenant's alone; its entry names its
    ``owner``) is reset the same way and kept for that tenant's next step here, so it is built
    once per process and tenant, not once per step; it is evicted whenever another tenant's
    step begins. Nothing of one tenant is then reachable from the next tenant's step.
    """

    def __init__(self) -> None:
        self.cache: dict[str, Any] = {}
        self.tenant: str | None = None  # whose step the shared things last served

    def serve(self, tenant: str | None) -> None:
        """Hand the shared things to ``tenant`` (None: to nobody, between steps): reset the
        adapters the last step trained, and drop every own model but ``tenant``'s (between
        steps: but the last served tenant's, which its next step here may use again)."""
        if tenant == self.tenant:
            return
        keep = tenant if tenant is not None else self.tenant
        for key, entry in list(self.cache.items()):
            owner = entry.get("owner")
            if owner is not None and owner != keep:  # another tenant's own model: drop it
                del self.cache[key]
            elif "peft" in entry and self.tenant is not None:
                reset_adapter(entry["peft"], entry["peft-init"])
        self.tenant = tenant


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
