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
from fedtune.engines import layout
from fedtune.engines.local import RunOptions, run_job
from fedtune.engines.provider import secagg as secagg_provider
from fedtune.engines.tenant import secagg as secagg_steps
from fedtune.secagg import identity, prg, protocol as p, shamir
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


def test_corrupted_shares_of_a_tenant_are_named_and_the_round_goes_on(
    tmp_path: Path, make_job: Callable[..., JobConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    respond = p.respond

    def c_lies(me, held, sharers, survivors, roster, previous=None):  # type: ignore[no-untyped-def]
        answer = respond(me, held, sharers, survivors, roster, previous)
        if me == "tenant-c":
            answer["seed"] = {u: f"{int(v, 16) ^ 1:x}" for u, v in answer["seed"].items()}
        return answer

    monkeypatch.setattr(p, "respond", c_lies)
    secure = make_job(rounds=1, secure_aggregation={"enabled": True, "threshold": 2})
    record = run_job(secure, NullTracker(), QUIET)["rounds"][0]
    assert record["accepted"] == ["tenant-a", "tenant-b", "tenant-c"]
    assert record["server_metrics"]["secagg/rejected_shares"] == 3
    notes = record["tenants"]["tenant-c"]["notes"]
    assert len(notes) == 3 and all("revealed by 'tenant-c' does not match" in n for n in notes)
    assert "notes" not in record["tenants"]["tenant-a"]
    plain = make_job(rounds=1)
    run_job(plain, NullTracker(), QUIET)
    a, b = final_adapter(plain), final_adapter(secure)
    assert all(torch.allclose(a[k], b[k], atol=1e-6, rtol=0) for k in a)


def test_a_provider_substituting_a_key_is_refused_naming_the_tenant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The provider routes a roster in which tenant-b's mask key is its own."""
    route = secagg_provider.route_keys_step

    def substitute(env, round_index, sampled, failed=None):  # type: ignore[no-untyped-def]
        out = route(env, round_index, sampled, failed)
        evil = p.TenantSecrets.new().masking.public.hex()
        for name in sampled:
            store = env.stores.exchange(name)
            roster = store.get_json(layout.secagg_key(round_index, "roster"))
            for ad in roster["ads"]:
                if ad["tenant"] == "tenant-b":
                    ad["mask"] = evil
            store.put_json(layout.secagg_key(round_index, "roster"), roster)
        return out

    # The round runs its provider steps from this table (shared with the KFP pipeline).
    monkeypatch.setitem(secagg_provider.PROVIDER_STEPS, "route-keys", substitute)
    job = registered_job(tmp_path, secure_aggregation={"enabled": True})
    with pytest.raises(SecureAggregationError) as info:
        run_job(job, NullTracker(), QUIET)
    assert "0 share deal(s) [], fewer than secure_aggregation.threshold=2" in str(info.value)
    stores = layout.JobStores(job)
    for tenant in job.tenants:  # each tenant's own error log says why, naming tenant-b
        assert f"{tenant.name}: secagg-share:" in str(info.value)
        why = stores.tenant(tenant).get_bytes("errors/round-000001-secagg-share.txt").decode()
        assert f"tenant {tenant.name!r} refuses the roster" in why
        assert "the advertisement of tenant 'tenant-b' fails its signature check" in why
    assert not any(Update.stored(layout.JobStores(job).exchange(t.name), layout.update_key(1)) for t in job.tenants)


def test_a_registered_tenant_without_its_private_key_is_told_how_to_make_it(tmp_path: Path) -> None:
    job = registered_job(tmp_path, secure_aggregation={"enabled": True})
    stores = layout.JobStores(job)
    stores.tenant(job.tenants[0]).delete(identity.STORE_KEY)
    record = run_job(job, NullTracker(), QUIET)["rounds"][0]  # the others still reach 2 of 3
    assert record["accepted"] == ["tenant-b", "tenant-c"]
    assert record["rejected"]["tenant-a"].startswith("secagg-advertise:")
    why = stores.tenant(job.tenants[0]).get_bytes("errors/round-000001-secagg-advertise.txt").decode()
    assert "tenant 'tenant-a' has a registered identity key but none in its store" in why
    assert "fedtune identity" in why


@pytest.mark.parametrize("dropped", [[], ["tenant-c"]])
def test_secagg_plus_with_two_neighbours_matches_the_plain_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dropped: list[str]
) -> None:
    """Five tenants on a ring (each masks with two neighbours, threshold 2 of 3)."""
    prepare = secagg_steps.prepare_update

    def drop(env, update, broadcast, parties):  # type: ignore[no-untyped-def]
        if env.tenant.name in dropped:
            raise SecureAggregationError(f"{env.tenant.name} went offline", fix="none")
        return prepare(env, update, broadcast, parties)

    monkeypatch.setattr(secagg_steps, "prepare_update", drop)
    secure = registered_job(tmp_path / "s", n=5, secure_aggregation={"enabled": True, "neighbours": 2})
    record = run_job(secure, NullTracker(), QUIET)["rounds"][0]
    assert record["accepted"] == [t.name for t in secure.tenants if t.name not in dropped]
    roster = p.Roster.from_json(layout.JobStores(secure).exchange("tenant-a").get_json(layout.secagg_key(1, "roster")))
    assert roster.degree == 2 and roster.threshold == 2
    dealt = layout.JobStores(secure).exchange("tenant-a").get_json(layout.secagg_key(1, "dealt"))
    assert len(dealt["sealed"]) == 3  # itself and its two neighbours, not all five
    plain = parse_job(tiny_job_dict(tmp_path / "p", tenants=_tenants(5), rounds=1))
    from fedtune.algorithms.fedavg import FedAvg

    original = FedAvg.client_step

    def nan_for_dropped(self, ctx, broadcast, data, client_state):  # type: ignore[no-untyped-def]
        update, state = original(self, ctx, broadcast, data, client_state)
        if data.tenant in dropped:
            update.tensors = {k: v * float("nan") for k, v in update.tensors.items()}
        return update, state

    monkeypatch.setattr(FedAvg, "client_step", nan_for_dropped)
    run_job(plain, NullTracker(), QUIET)
    a, b = final_adapter(plain), final_adapter(secure)
    assert all(torch.allclose(a[k], b[k], atol=1e-6, rtol=0) for k in a)
