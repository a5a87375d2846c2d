"""The round's broadcast is written once, not once per tenant: what the provider writes per
round does not grow with the tenants, and each tenant still reads its own full copy."""

from __future__ import annotations

from pathlib import Path

from fedtune.benchmarks.tenant_scale import provider_folders, stored_files
from fedtune.config import parse_job
from fedtune.core.messages import Broadcast
from fedtune.engines import layout, steps
from tests.integration.conftest import DATA, tiny_job_dict


def _configured(workdir: Path, tenants: int) -> tuple[steps.ProviderEnv, int]:
    """Round 1 configured for ``tenants`` tenants, all sampled; the bytes configure wrote."""
    data = [DATA / f"tenant-{x}.jsonl" for x in "abc"]
    job = parse_job(tiny_job_dict(
        workdir, clients_per_round=tenants, min_clients=1,
        tenants=[{"name": f"t{i}", "data_uri": str(data[i % 3])} for i in range(tenants)],
    ))
    env = steps.ProviderEnv.create(job)
    steps.init_step(env)
    before = stored_files(provider_folders(job))
    steps.configure_step(env, 1)
    after = stored_files(provider_folders(job))
    return env, sum(size for node, size in after.items() if node not in before)


def test_bytes_the_provider_writes_per_round_do_not_grow_with_tenants(tmp_path: Path) -> None:
    two, written_two = _configured(tmp_path / "two", 2)
    six, written_six = _configured(tmp_path / "six", 6)
    assert written_two == written_six
    record = Broadcast.load(six.store(), layout.broadcast_key(1))
    assert 0 < record.nbytes < written_six  # the record (and at most one copy) on disk
    for name in steps.sample_clients(six.job, 1):  # every tenant still reads the whole message
        copy = Broadcast.load(six.stores.exchange(name), layout.round_broadcast_key(1))
        assert copy.meta == record.meta
        assert copy.tensors.keys() == record.tensors.keys()
        assert all(copy.tensors[k].equal(record.tensors[k]) for k in record.tensors)


def test_a_resumed_configure_fills_in_the_missing_copies(tmp_path: Path) -> None:
    env, _ = _configured(tmp_path, 4)
    key = layout.round_broadcast_key(1)
    lost = env.stores.exchange("t2")
    original = lost.get_bytes(f"{key}.safetensors")
    for suffix in (".json", ".safetensors"):  # as a crash half-way through the tenants leaves it
        lost.delete(key + suffix)
    assert steps.configure_step(env, 1)["skipped"]
    assert lost.get_bytes(f"{key}.safetensors") == original
