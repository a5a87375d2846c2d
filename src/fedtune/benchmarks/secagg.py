"""``fedtune bench system --parts secagg``: what secure aggregation costs per round.

One round's aggregation of the same updates, plain and secure, side by side in one process
(every party in turn, one torch thread), alternating plain and secure repetitions and
keeping the best of each: the ratio is what load on a shared machine cannot fake. Every
message goes through a real local store as the engine writes it (JSON or safetensors with
a sha256 beside it), so its bytes are exact:

- plain: each tenant uploads its update; the provider loads them and takes the weighted mean.
- secure: the protocol's four steps (:mod:`fedtune.secagg.protocol`) with signed keys, sealed
  shares, fixed-point masking and unmasking; the mean must match the plain one.

Training is left out: it is the same with and without secure aggregation.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedtune.aggregation import TensorSpec, weighted_mean
from fedtune.core.messages import Update
from fedtune.secagg import fixedpoint, graph, identity, protocol as p, vector
from fedtune.storage.local import LocalStore

Log = Callable[[str], None]
CONTEXT = "fedtune-secagg|bench|round-000001"


@dataclass(frozen=True)
class SecAggSpec:
    """Tenant counts, graphs and update size of the secure-aggregation benchmark."""

    tenants: tuple[int, ...] = (3, 5, 10, 20, 40)
    neighbours: tuple[str, ...] = ("all", "auto")
    tensors: int = 8
    tensor_size: int = 17_408  # 8 x 17,408 float32 = 544 KiB, a small LoRA adapter
    reps: int = 3
    frac_bits: int = 24


def commit() -> str | None:
    """The checked-out commit (short), or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def _updates(spec: SecAggSpec, n: int) -> tuple[list[dict[str, torch.Tensor]], list[float]]:
    gen = torch.Generator().manual_seed(n)
    updates = [
        {f"adapter/t{j}": torch.randn(spec.tensor_size, generator=gen) * 0.01 for j in range(spec.tensors)}
        for _ in range(n)
    ]
    return updates, [float(10 + 5 * i) for i in range(n)]


def plain_round(store: LocalStore, updates: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, Any]:
    """Upload, load, weighted mean."""
    up = 0
    for i, tensors in enumerate(updates):
        up += Update(tensors=tensors, meta={"num_samples": int(weights[i])}).save(store, f"t{i}/update")
    loaded = [Update.load(store, f"t{i}/update").group("adapter") for i in range(len(updates))]
    return {"mean": weighted_mean(loaded, weights), "up": up, "down": 0}


def secure_round(
    store: LocalStore,
    updates: list[dict[str, torch.Tensor]],
    weights: list[float],
    ids: dict[str, tuple[bytes, bytes]],
    degree: int,
    frac_bits: int,
) -> dict[str, Any]:
    """The four protocol steps through the store; returns the mean and the bytes each way."""
    names = sorted(ids)
    registered = {u: ids[u][1] for u in names}
    specs = {k: TensorSpec(tuple(v.shape), v.dtype) for k, v in updates[0].items()}
    n = len(names)
    up = down = 0
    secrets = {u: p.TenantSecrets.new() for u in names}
    for u in names:  # 1. advertise
        up += store.put_json(f"{u}/advert.json", secrets[u].advertisement(u, CONTEXT, ids[u][0]).to_json())
    ads = {u: p.Advertisement.from_json(store.get_json(f"{u}/advert.json")) for u in names}
    size = degree + 1
    roster = p.Roster(CONTEXT, size // 2 + 1, ads, tuple(names), None if degree >= n - 1 else degree, "00" * 32)
    for u in names:
        down += store.put_json(f"{u}/roster.json", roster.to_json())
    dealt = {}
    for u in names:  # 2. share
        routed = p.Roster.from_json(store.get_json(f"{u}/roster.json"))
        secrets[u], d = p.deal(u, secrets[u], routed, registered, ids[u][0])
        up += store.put_json(f"{u}/dealt.json", d.to_json())
        dealt[u] = p.Dealt.from_json(store.get_json(f"{u}/dealt.json"))
    for v in names:
        inbox = {"sharers": names, "dealt": {u: d.part(v).to_json() for u, d in dealt.items() if v in d.sealed}}
        down += store.put_json(f"{v}/inbox.json", inbox)
    held = {}
    for i, u in enumerate(names):  # 3. masked upload
        inbox = store.get_json(f"{u}/inbox.json")
        got = {w: p.Dealt.from_json(d) for w, d in inbox["dealt"].items()}
        held[u], _ = p.open_shares(u, secrets[u], roster, got, registered)
        encoded = fixedpoint.encode(vector.flatten(updates[i], specs) * weights[i], frac_bits, n)
        masked = p.mask(u, secrets[u], roster, inbox["sharers"], encoded)
        out = Update(tensors={"secagg/masked": torch.from_numpy(masked.view(np.int64).copy())}, meta={"w": weights[i]})
        up += out.save(store, f"{u}/update")
    request = {"sharers": names, "survivors": names}
    for u in names:
        down += store.put_json(f"{u}/unmask-request.json", request)
    for u in names:  # 4. unmask
        req = store.get_json(f"{u}/unmask-request.json")
        up += store.put_json(f"{u}/unmask.json", p.respond(u, held[u], req["sharers"], req["survivors"], roster))
    uploads = {u: Update.load(store, f"{u}/update").tensors["secagg/masked"].numpy().view(np.uint64) for u in names}
    answers = {u: store.get_json(f"{u}/unmask.json") for u in names}
    total = p.unmask(roster, dealt, uploads, answers).total
    mean = vector.unflatten(fixedpoint.decode(total, frac_bits) / sum(weights), specs)
    return {"mean": {k.split("/", 1)[1]: v for k, v in mean.items()}, "up": up, "down": down}


def _timed(fn: Callable[[], dict[str, Any]]) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def secagg_overhead(spec: SecAggSpec, log: Log, tenants: Sequence[int] | None = None) -> dict[str, Any]:
    """Rows of bytes (exact) and time (best of alternating repetitions) per round."""
    measured_at = commit()  # before anything runs: the code this process imported
    rows = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for n in tenants or spec.tenants:
            updates, weights = _updates(spec, n)
            ids = {f"t{i:03d}": identity.generate() for i in range(n)}
            for setting in spec.neighbours:
                k = graph.degree(setting if setting in ("all", "auto") else int(setting), n)
                if setting != "all" and k >= n - 1:
                    continue  # the complete graph already: same row as "all"
                best_plain = best_secure = float("inf")
                plain: dict[str, Any] = {}
                secure: dict[str, Any] = {}
                for _ in range(spec.reps):
                    with tempfile.TemporaryDirectory(prefix="fedtune-secagg-") as tmp:
                        seconds, plain = _timed(lambda: plain_round(LocalStore(Path(tmp) / "p"), updates, weights))  # noqa: B023 - called at once
                        best_plain = min(best_plain, seconds)
                        seconds, secure = _timed(
                            lambda: secure_round(LocalStore(Path(tmp) / "s"), updates, weights, ids, k, spec.frac_bits)  # noqa: B023
                        )
                        best_secure = min(best_secure, seconds)
                diff = max(float((plain["mean"][key] - secure["mean"][key]).abs().max()) for key in plain["mean"])
                row = {
                    "tenants": n,
                    "neighbours": setting,
                    "degree": k,
                    "threshold": (k + 1) // 2 + 1,
                    "params": spec.tensors * spec.tensor_size,
                    "plain_up_bytes": plain["up"] // n,
                    "secure_up_bytes": secure["up"] // n,
                    "secure_down_bytes": secure["down"] // n,
                    "up_ratio": secure["up"] / plain["up"],
                    "plain_seconds": best_plain,
                    "secure_seconds": best_secure,
                    "time_ratio": best_secure / best_plain,
                    "max_abs_diff": diff,
                }
                log(
                    f"secagg n={n} {setting} (k={k}): up {row['up_ratio']:.3f} x plain per tenant, "
                    f"time {row['time_ratio']:.2f} x plain (best of {spec.reps})"
                )
                rows.append(row)
    finally:
        torch.set_num_threads(threads)
    return {"spec": asdict(spec), "commit": measured_at, "rows": rows}
