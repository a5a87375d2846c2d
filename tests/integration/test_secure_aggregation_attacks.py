"""Secure aggregation against a provider that looks at, or tampers with, what it routes."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedtune.config import JobConfig, parse_job
from fedtune.core.errors import SecureAggregationError
from fedtune.core.messages import Update
from fedtune.engines import layout, secagg_provider, secagg_steps
from fedtune.engines.local import RunOptions, run_job
from fedtune.secagg import identity, prg, shamir
from fedtune.secagg import protocol as p
from fedtune.tracking.base import NullTracker

from tests.integration.conftest import DATA, tiny_job_dict
from tests.integration.test_fedit_reference import final_adapter

QUIET = RunOptions(progress=False)
HEX32 = re.compile(r"^[0-9a-f]{64}$")


def _tenants(n: int) -> list[dict[str, Any]]:
    """``n`` tenants over the three quickstart files (several tenants may share a file)."""
    return [{"name": f"tenant-{chr(97 + i)}", "data_uri": str(DATA / f"tenant-{'abc'[i % 3]}.jsonl")} for i in range(n)]


def registered_job(tmp_path: Path, n: int = 3, **overrides: Any) -> JobConfig:
    """A secure job whose tenants have registered identities (private halves in their stores)."""
    pairs = {t["name"]: identity.generate() for t in _tenants(n)}
    tenants = [{**t, "identity_key": pairs[t["name"]][1].hex()} for t in _tenants(n)]
    job = parse_job(tiny_job_dict(tmp_path, tenants=tenants, rounds=1, **overrides))
    stores = layout.JobStores(job)
    for tenant in job.tenants:
        stores.tenant(tenant).put_json(identity.STORE_KEY, {"private": pairs[tenant.name][0].hex()})
    return job


def _provider_objects(workdir: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Every JSON document and every masked upload the provider can read (its store and the
    exchange; tenant-private stores excluded), by path."""
    from safetensors.numpy import load_file

    docs: dict[str, Any] = {}
    uploads: dict[str, np.ndarray] = {}
    for path in sorted(workdir.rglob("*")):
        if not path.is_file() or path.relative_to(workdir).parts[0] == "tenants":
            continue
        if path.suffix == ".json":
            try:
                docs[str(path)] = json.loads(path.read_text())
            except ValueError:
                continue
        elif path.suffix == ".safetensors":
            for key, array in load_file(str(path)).items():
                if key == secagg_steps.MASKED:
                    uploads[str(path)] = array.view(np.uint64)
    return docs, uploads


def _strings(doc: Any) -> list[str]:
    if isinstance(doc, dict):
        return [s for v in [*doc.values(), *doc.keys()] for s in _strings(v)]
    if isinstance(doc, list):
        return [s for v in doc for s in _strings(v)]
    return [doc] if isinstance(doc, str) else []


def _offline_d(monkeypatch: pytest.MonkeyPatch, encoded: dict[str, np.ndarray]) -> None:
    """tenant-d drops after sharing keys; every other tenant's encoded update is kept."""
    prepare = secagg_steps.prepare_update

    def keep(env, update, broadcast, parties):  # type: ignore[no-untyped-def]
        if env.tenant.name == "tenant-d":
            raise SecureAggregationError("tenant-d went offline", fix="none")
        out, weight = prepare(env, update, broadcast, parties)
        encoded[env.tenant.name] = out
        return out, weight

    monkeypatch.setattr(secagg_steps, "prepare_update", keep)


def test_everything_the_provider_holds_does_not_unmask_a_single_upload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round of 4 where tenant-d drops after sharing keys (its mask key is then rebuilt, by
    design). The provider tries every 32-byte value it can find in any object or rebuild from
    revealed shares, as a self-mask seed and as a mask key against every advertised key, on
    every upload: no upload yields any tenant's encoded update."""
    encoded: dict[str, np.ndarray] = {}
    _offline_d(monkeypatch, encoded)
    job = registered_job(tmp_path, n=4, secure_aggregation={"enabled": True, "threshold": 3})
    summary = run_job(job, NullTracker(), QUIET)
    assert summary["rounds"][0]["accepted"] == ["tenant-a", "tenant-b", "tenant-c"]
    docs, uploads = _provider_objects(Path(job.workdir))
    assert len(uploads) == 3 and len(encoded) == 3
    roster = p.Roster.from_json(next(d for d in docs.values() if isinstance(d, dict) and "ads" in d))
    candidates = {bytes.fromhex(s) for d in docs.values() for s in _strings(d) if HEX32.match(s)}
    answers = {
        v: doc
        for path, doc in docs.items()
        for v in roster.names
        if path.endswith("secagg/unmask.json") and f"/{layout.tenant_prefix(v)}/" in path
    }
    rebuilt = 0
    for kind in ("seed", "key"):
        for dealer in roster.names:
            shares = {roster.point(v): int(a[kind][dealer], 16) for v, a in answers.items() if dealer in a[kind]}
            if len(shares) >= roster.threshold:
                secret = shamir.combine(shares, roster.threshold)
                assert secret is not None
                candidates.add(secret)
                rebuilt += 1
    assert rebuilt == 4  # the seeds of a, b, c and the key of d: never a survivor's key
    # The attack, on each upload: strip every mask computable from what is held.
    assert all(_strip(roster, upload_of(uploads, u), u, candidates, encoded[u]) < 0.01 for u in encoded)
    # The same attack with the survivors' private mask keys (tenant-private) does succeed:
    # only their secrecy stands between the provider and an update.
    stores = layout.JobStores(job)
    leaked = set(candidates)
    for tenant in job.tenants:
        kept = stores.tenant(tenant).get_json(layout.secagg_secrets_key(1))
        leaked.add(bytes.fromhex(kept["secrets"]["mask"]))
    assert all(_strip(roster, upload_of(uploads, u), u, leaked, encoded[u]) == 1.0 for u in encoded)


def upload_of(uploads: dict[str, np.ndarray], tenant: str) -> np.ndarray:
    return next(y for path, y in uploads.items() if f"/{layout.tenant_prefix(tenant)}/" in path)


def _strip(roster: p.Roster, y: np.ndarray, u: str, candidates: set[bytes], truth: np.ndarray) -> float:
    """Remove from ``u``'s upload every pairwise mask whose key is among ``candidates`` and
    then each candidate as its self-mask seed; the best share of coordinates equal to the truth."""
    from fedtune.secagg import keys

    n = len(y)
    owned = {x: c for c in candidates for x, ad in roster.ads.items() if keys.public_of(c) == ad.mask_public}
    for v in roster.neighbourhood(u):
        if v == u or not ({u, v} & set(owned)):
            continue
        mine = owned.get(u)
        seed = (
            p.pairwise_seed(mine, roster.ads[v].mask_public, roster.context, u, v)
            if mine is not None
            else p.pairwise_seed(owned[v], roster.ads[u].mask_public, roster.context, v, u)
        )
        m = prg.mask(seed, n)
        y = y - m if u < v else y + m
    return max(float(np.mean(y - prg.mask(c, n) == truth)) for c in candidates)
