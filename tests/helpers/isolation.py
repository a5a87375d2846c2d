"""Run tenant A's then tenant B's client step as a worker does, and list what of A's remains.

``python -m tests.helpers.isolation MODE JOB_JSON A B`` runs in a fresh process (nothing of an
earlier test can hold a matching tensor), with MODE ``worker`` (the worker loop itself,
:func:`fedtune.engines.workers._worker_main`, fed the two tasks over a scripted connection)
or ``in-process`` (the local engine's :class:`~fedtune.engines.workers.InProcessRunner`).
When B's task is handed over, it walks every object the garbage collector tracks (and the
tensors, gradients and attributes they hold) for a tensor equal by value to one of A's
update or kept-state tensors, and for A's data; it prints what it found as JSON.
"""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Iterator
from typing import Any

import torch

from fedtune.config import parse_job
from fedtune.config.job import JobConfig
from fedtune.core.messages import Broadcast, ClientState, Update
from fedtune.engines import layout
from fedtune.training.context import TenantData


def references(job: JobConfig, tenant: str) -> list[torch.Tensor]:
    """A's update and kept-state tensors that carry its training: not equal to anything in
    the round's broadcast, and not constant (a zero tensor matches too much by chance)."""
    stores = layout.JobStores(job)
    exchange = stores.exchange(tenant)
    out = list(Update.load(exchange, layout.update_key(1)).tensors.values())
    own = stores.tenant(next(t for t in job.tenants if t.name == tenant))
    if own.exists(layout.client_state_key(1) + ".json"):
        out += list(ClientState.load(own, layout.client_state_key(1)).tensors.values())
    sent = list(Broadcast.load(exchange, layout.round_broadcast_key(1)).tensors.values())
    return [
        t for t in out
        if t.numel() > 1 and t.is_floating_point() and not bool((t == t.flatten()[0]).all())
        and not any(_same(t, s) for s in sent)
    ]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype or a.device.type == "meta":
        return False
    return bool(torch.equal(a.detach().cpu(), b.detach().cpu()))


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Tensors ``obj`` is or directly references (as the garbage collector sees references:
    items, values, attributes), with their gradients and tensor attributes."""
    for item in [obj, *gc.get_referents(obj)]:
        if isinstance(item, torch.Tensor):
            yield item
            if item.is_leaf and item.grad is not None:
                yield item.grad
            for value in gc.get_referents(item):
                if isinstance(value, torch.Tensor):
                    yield value
                elif isinstance(value, dict):  # a tensor's attributes (Opacus's grad_sample)
                    yield from (v for v in dict.values(value) if isinstance(v, torch.Tensor))


def _storage(tensor: torch.Tensor) -> int:
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):  # no storage (meta, sparse): not a copy of ours
        return -1


def holders(refs: list[torch.Tensor], tenant: str) -> list[str]:
    """Descriptions of every tracked object holding one of ``refs`` by value, or A's data."""
    gc.collect()
    mine = {id(r) for r in refs}
    ours = {_storage(r) for r in refs}  # other views of the copies this probe loaded
    found: list[str] = []
    seen: set[int] = set()
    for obj in gc.get_objects():
        if isinstance(obj, TenantData) and obj.tenant == tenant:
            held_by = sorted({type(r).__name__ for r in gc.get_referrers(obj)} - {"list"})
            found.append(f"TenantData of {tenant}, held by {held_by}")
        for tensor in _tensors(obj):
            if id(tensor) in mine or id(tensor) in seen or _storage(tensor) in ours:
                continue
            seen.add(id(tensor))
            if any(_same(tensor, r) for r in refs):
                found.append(f"{type(obj).__name__} holds a {tuple(tensor.shape)} tensor of {tenant}'s")
    return found


class ScriptedConnection:
    """The engine's end of a worker's pipe, scripted: sends the tasks, then the stop message;
    just before B's task it checks what the worker still holds of A."""

    def __init__(self, job: JobConfig, a: str, b: str) -> None:
        self.job, self.a = job, a
        self.messages = [json.dumps({"kind": "client", "round_index": 1, "tenant": t}).encode()
                         for t in (a, b)] + [b""]
        self.replies: list[dict[str, Any]] = []
        self.found: list[str] | None = None

    def recv_bytes(self) -> bytes:
        if len(self.messages) == 2:  # A's task is done; B's is next
            refs = references(self.job, self.a)
            self.found = holders(refs, self.a) if refs else ["no reference tensors"]
            del refs
        return self.messages.pop(0)

    def send_bytes(self, data: bytes) -> None:
        self.replies.append(json.loads(data))


def probe(mode: str, job: JobConfig, a: str, b: str) -> dict[str, Any]:
    """Run A's and B's client steps of round 1 as ``mode`` says; what of A's B's step met."""
    from fedtune.engines import steps
    from fedtune.engines.workers import (
        InProcessRunner,
        Outcome,
        Task,
        _worker_main,
        tenant_views_json,
    )

    if mode == "worker":
        conn = ScriptedConnection(job, a, b)
        _worker_main(conn, tenant_views_json(job), 1, None)  # type: ignore[arg-type]
        return {"found": conn.found, "failures": [r["failure"] for r in conn.replies]}
    state: dict[str, Any] = {}

    def after(outcome: Outcome) -> None:
        if outcome.task.tenant == a:
            refs = references(job, a)
            state["found"] = holders(refs, a) if refs else ["no reference tensors"]

    outcomes = InProcessRunner(steps.TenantEnvs(job), threads=1).run(
        [Task("client", 1, a), Task("client", 1, b)], on_done=after
    )
    return {"found": state.get("found"), "failures": [o.failure for o in outcomes.values()]}


if __name__ == "__main__":
    mode, job_json, first, second = sys.argv[1:5]
    result = probe(mode, parse_job(json.loads(job_json), source="probe"), first, second)
    print("ISOLATION " + json.dumps(result))
