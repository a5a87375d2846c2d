"""Hostile updates planted in a tenant's exchange prefix: one table, every row refused.

Each row replaces tenant-b's update of a real FedAvg round (tiny model, three tenants) after
the client steps ran, as a tenant (or whoever holds its prefix) could, and then runs the
provider's aggregate step. Every row must be rejected for tenant-b with its reason in the
round record, the round going on with the other two tenants, whose aggregate must be
bitwise the one a round without tenant-b's update gives. The round's client steps run once
per module; each row works on a copy of their work directory.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from fedtune.config import JobConfig, parse_job
from fedtune.core.messages import Broadcast, ServerState, Update
from fedtune.engines import layout, steps
from fedtune.engines.local import RunOptions, run_job
from fedtune.engines.summary import RoundRecord
from fedtune.engines.tenant import secagg as secagg_steps
from fedtune.storage import LocalStore
from fedtune.storage.base import Store
from fedtune.storage.keys import SIDECAR_SUFFIX
from fedtune.tracking.base import NullTracker
from tests.helpers.moto import admin_client, create_bucket, use_fake_aws_env
from tests.integration.conftest import tiny_job_dict
from tests.kfp.test_tenant_pod import moto_endpoint  # noqa: F401 - a module-scoped fixture

KEY = layout.update_key(1)
BLOB = f"{KEY}.safetensors"
SAMPLED = ["tenant-a", "tenant-b", "tenant-c"]


@dataclass
class Round:
    """Round 1 with every client step done and nothing aggregated yet, in ``workdir``."""

    workdir: Path
    clients: dict[str, dict[str, Any]]

    def copy(self, dst: Path, endpoint: str | None = None) -> JobConfig:
        """The round in a copy of its work directory; with ``endpoint``, its exchange store
        moves to a fresh bucket there (the updates, all the aggregate step reads of it)."""
        shutil.copytree(self.workdir, dst)
        if endpoint is None:
            return parse_job(tiny_job_dict(dst, rounds=1, min_clients=2))
        bucket, folder = create_bucket(endpoint), dst / "exchange"
        for path in folder.rglob("update.*"):
            admin_client(endpoint).put_object(Bucket=bucket, Key=path.relative_to(folder).as_posix(),
                                              Body=path.read_bytes())
        return parse_job(tiny_job_dict(dst, rounds=1, min_clients=2, exchange_uri=f"s3://{bucket}",
                                       provider_store_uri=str(dst / "provider")))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Round:
    workdir = tmp_path_factory.mktemp("planted") / "w"
    job = parse_job(tiny_job_dict(workdir, rounds=1, min_clients=2))
    provider = steps.ProviderEnv.create(job)
    steps.init_step(provider)
    steps.configure_step(provider, 1)
    assert steps.sample_clients(job, 1) == SAMPLED
    clients = {n: steps.client_step(steps.TenantEnv.create(job, n), 1) for n in SAMPLED}
    return Round(workdir, clients)


def _aggregate(job: JobConfig, clients: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The provider's aggregate step and the round's record and new state tensors."""
    provider = steps.ProviderEnv.create(job)
    out = steps.aggregate_step(provider, 1, SAMPLED)
    record = RoundRecord.build(1, SAMPLED, {}, clients, out, 1.0).to_json()
    return record, ServerState.load(provider.store(), layout.state_key(1)).tensors


@pytest.fixture(scope="module")
def without_b(trained: Round, tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The state of the same round where tenant-b's update never arrived."""
    job = trained.copy(tmp_path_factory.mktemp("without-b") / "w")
    exchange = layout.JobStores(job).exchange("tenant-b")
    for half in (BLOB, f"{KEY}.json"):
        exchange.delete(half)
    record, state = _aggregate(job, trained.clients)
    assert record["accepted"] == ["tenant-a", "tenant-c"]
    return state


@dataclass
class Prefixes:
    """Tenant-b's exchange prefix (its store, raw access to its objects behind the store's
    back and, on a local store, its folder), tenant-a's folder, a folder outside the store."""

    b: Store
    read_raw: Callable[[str], bytes]
    write_raw: Callable[[str, bytes], None]
    b_dir: Path | None
    a_dir: Path | None
    outside: Path


def _prefixes(job: JobConfig, backend: str, endpoint: str | None, outside: Path) -> Prefixes:
    stores = layout.JobStores(job)
    a, b = stores.exchange("tenant-a"), stores.exchange("tenant-b")
    if backend == "file":
        assert isinstance(a, LocalStore) and isinstance(b, LocalStore)
        folder = b.path
        return Prefixes(b, lambda k: folder.joinpath(*k.split("/")).read_bytes(),
                        lambda k, d: folder.joinpath(*k.split("/")).write_bytes(d), b.path, a.path, outside)
    bucket, _, head = b.uri.removeprefix("s3://").partition("/")
    client = admin_client(str(endpoint))
    return Prefixes(
        b,
        lambda k: client.get_object(Bucket=bucket, Key=f"{head}/{k}")["Body"].read(),
        lambda k, d: client.put_object(Bucket=bucket, Key=f"{head}/{k}", Body=d),
        None, None, outside,
    )


# -- what a row plants -------------------------------------------------------------------------
def _tensors(change: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[Prefixes], None]:
    """Rewrite tenant-b's update (a well-formed, checksummed message) with ``change`` applied."""

    def plant(p: Prefixes) -> None:
        update = Update.load(p.b, KEY)
        change(update.tensors)
        update.save(p.b, KEY)

    return plant


def _first(change: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[Prefixes], None]:
    def apply(tensors: dict[str, torch.Tensor]) -> None:
        name = sorted(tensors)[0]
        tensors[name] = change(tensors[name])

    return _tensors(apply)


def _one_huge(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t.view(-1)[0] = 1e30  # finite: passes every NaN/Inf check
    return t


def _meta(**fields: Any) -> Callable[[Prefixes], None]:
    def plant(p: Prefixes) -> None:
        p.b.put_json(f"{KEY}.json", {**p.b.get_json(f"{KEY}.json"), **fields})

    return plant


def _blob(data: Callable[[Prefixes], bytes]) -> Callable[[Prefixes], None]:
    """Replace the tensors half by ``data`` with a matching checksum (a store write)."""
    return lambda p: p.b.put_bytes(BLOB, data(p))


class _RunsCode:
    """A pickle that runs code when loaded: it would create the file it names."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def _pickle(p: Prefixes) -> bytes:
    return pickle.dumps({"adapter": _RunsCode(p.outside / "pickle-ran")})


def _bad_header(p: Prefixes) -> bytes:
    # A safetensors header claims its length in the first 8 bytes: here far more than follows.
    return struct.pack("<Q", 2**40) + json.dumps({"__metadata__": {}}).encode()


def _flip_a_byte(p: Prefixes) -> None:
    """Change the blob behind its checksum (raw bytes, the sidecar left as it was)."""
    data = bytearray(p.read_raw(BLOB))
    data[-1] ^= 0xFF
    p.write_raw(BLOB, bytes(data))


def _link(target: Callable[[Prefixes], Path]) -> Callable[[Prefixes], None]:
    """Make the tensors half (and its sidecar) symbolic links to ``target`` (and its sidecar):
    well-formed tensors whose checksum matches, reached through a link."""

    def plant(p: Prefixes) -> None:
        assert p.b_dir is not None  # a bucket has no symbolic links
        to = target(p)
        for suffix in ("", SIDECAR_SUFFIX):
            link = p.b_dir.joinpath(*(BLOB + suffix).split("/"))
            link.unlink()
            os.symlink(str(to) + suffix, link)

    return plant


def _copy_outside(p: Prefixes) -> Path:
    """Tenant-b's own update, moved to a folder outside the exchange store."""
    assert p.b_dir is not None
    src = p.b_dir.joinpath(*BLOB.split("/"))
    for suffix in ("", SIDECAR_SUFFIX):
        shutil.copyfile(str(src) + suffix, p.outside / ("update.safetensors" + suffix))
    return p.outside / "update.safetensors"


ROWS = [
    pytest.param(_first(lambda t: t.clone().fill_(float("nan"))), "non-finite", id="nan"),
    pytest.param(_first(lambda t: t.to(torch.bfloat16)), "dtype torch.bfloat16, expected torch.float32",
                 id="bf16-dtype"),
    pytest.param(_first(lambda t: t.to(torch.float64)), "dtype torch.float64", id="fp64-dtype"),
    pytest.param(_first(lambda t: torch.zeros(3, 3)), "shape (3, 3), expected", id="wrong-shape"),
    pytest.param(_tensors(lambda ts: ts.update({"adapter/smuggled": torch.zeros(1024)})),
                 "unexpected keys 'adapter/smuggled'", id="extra-key"),
    pytest.param(_tensors(lambda ts: ts.update({"../../../provider/state": torch.zeros(4)})),
                 "unexpected keys '../../../provider/state'", id="path-traversal-name"),
    pytest.param(_blob(_pickle), "is not a safetensors file", id="pickle-payload"),
    pytest.param(_blob(_bad_header), "is not a safetensors file", id="bad-header"),
    pytest.param(_flip_a_byte, "does not match its checksum", id="wrong-checksum"),
    pytest.param(_link(_copy_outside), "is a symbolic link that leads to", id="symlink-out-of-store"),
    pytest.param(_link(lambda p: Path(str(p.a_dir)).joinpath(*BLOB.split("/"))), "is a symbolic link that leads to",
                 id="symlink-to-another-tenant"),
    pytest.param(_first(_one_huge), "exceeds the bound", id="finite-1e30"),
    pytest.param(_meta(num_samples=10**9), "exceeds its cap of 1000000", id="absurd-samples"),
    pytest.param(_meta(num_samples=0), "positive integer", id="zero-samples"),
    pytest.param(_meta(num_samples=-5), "positive integer", id="negative-samples"),
    pytest.param(_meta(num_samples=2.5), "positive integer", id="float-samples"),
]


LINKS = ("symlink-out-of-store", "symlink-to-another-tenant")  # a bucket has no links


def _table() -> list[Any]:
    """Every row on a local exchange store, and every row but the links on S3."""
    return [
        pytest.param(*row.values, backend, id=f"{row.id}-{backend}")
        for backend in ("file", "s3")
        for row in ROWS
        if backend == "file" or row.id not in LINKS
    ]


@pytest.mark.parametrize(("plant", "reason", "backend"), _table())
def test_a_planted_update_is_rejected_for_its_tenant_and_the_round_goes_on(
    trained: Round,
    without_b: dict[str, torch.Tensor],
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    plant: Callable[[Prefixes], None],
    reason: str,
    backend: str,
) -> None:
    endpoint = None
    if backend == "s3":
        endpoint = request.getfixturevalue("moto_endpoint")
        use_fake_aws_env(monkeypatch, endpoint)
    job = trained.copy(tmp_path / "w", endpoint)
    outside = tmp_path / "outside"
    outside.mkdir()
    plant(_prefixes(job, backend, endpoint, outside))

    record, state = _aggregate(job, trained.clients)

    assert record["accepted"] == ["tenant-a", "tenant-c"], record["rejected"]
    assert list(record["rejected"]) == ["tenant-b"]
    assert reason in record["rejected"]["tenant-b"]
    assert state.keys() == without_b.keys()
    assert all(torch.equal(state[k], without_b[k]) for k in state)  # b added nothing
    assert not (outside / "pickle-ran").exists()


@pytest.mark.slow  # a whole secure round: the provider step that aborted is request-unmask
def test_under_secure_aggregation_a_link_out_of_the_prefix_counts_as_its_tenant_dropping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The provider cannot reject one masked update, but it must not stop on one either: a
    masked upload the store refuses is a dropout, whose masks the others' shares recover
    (before, the provider's request-unmask step stopped the run with exit 4)."""
    masked_upload = secagg_steps.TENANT_STEPS["client"]
    outside = tmp_path / "outside"
    outside.mkdir()

    def upload_then_link(env: steps.TenantEnv, round_index: int) -> dict[str, Any]:
        out = masked_upload(env, round_index)
        if env.tenant.name == "tenant-b":
            assert isinstance(env.exchange, LocalStore)
            folder = env.exchange.path
            _link(_copy_outside)(Prefixes(env.exchange, lambda k: b"", lambda k, d: None, folder, None, outside))
        return out

    monkeypatch.setitem(secagg_steps.TENANT_STEPS, "client", upload_then_link)
    job = parse_job(tiny_job_dict(tmp_path / "w", rounds=1, secure_aggregation={"enabled": True, "threshold": 2}))
    record = run_job(job, NullTracker(), RunOptions(progress=False))["rounds"][0]
    assert record["accepted"] == ["tenant-a", "tenant-c"]
    # Its own later step (unmask) meets the same refusal; its failure is what the record keeps.
    assert "StoreError" in record["rejected"]["tenant-b"]


def test_a_link_planted_where_the_provider_publishes_is_replaced_not_followed(tmp_path: Path) -> None:
    """A tenant's broadcast keys are the provider's to write: a link planted there in
    advance neither stops the configure step nor lets the provider write through it."""
    job = parse_job(tiny_job_dict(tmp_path / "w", rounds=1))
    provider = steps.ProviderEnv.create(job)
    steps.init_step(provider)
    b = layout.JobStores(job).exchange("tenant-b")
    assert isinstance(b, LocalStore)
    link = b.path.joinpath(*f"{layout.round_broadcast_key(1)}.json".split("/"))
    link.parent.mkdir(parents=True)
    for suffix in ("", SIDECAR_SUFFIX):  # a "complete" message, as far as names go
        (tmp_path / f"outside{suffix}").write_text("not the provider's")
        os.symlink(tmp_path / f"outside{suffix}", f"{link}{suffix}")

    steps.configure_step(provider, 1)

    assert not link.is_symlink() and not Path(f"{link}{SIDECAR_SUFFIX}").is_symlink()
    assert {p.read_text() for p in tmp_path.glob("outside*")} == {"not the provider's"}
    mine, theirs = (Broadcast.load(layout.JobStores(job).exchange(t), layout.round_broadcast_key(1))
                    for t in ("tenant-a", "tenant-b"))
    assert mine.meta == theirs.meta and all(torch.equal(mine.tensors[k], theirs.tensors[k]) for k in mine.tensors)
