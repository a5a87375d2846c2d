"""``storage.state_retention``: a run keeps only its newest server states, and resumes from them.

Counts the objects a 10-round run leaves in the provider store and the exchange, resumes a
chained run from the last kept state and compares it bit for bit with a straight run, and
SIGKILLs a run between writing a newer state and pruning the older ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from fedtune.config import JobConfig, parse_job
from fedtune.core.errors import ConfigError
from fedtune.engines import layout
from fedtune.engines.local import RunOptions, run_job
from fedtune.storage.base import Store
from fedtune.tracking.base import NullTracker
from tests.integration.conftest import tiny_job_dict
from tests.integration.crash_helpers import run

QUIET = RunOptions(progress=False)
ROUNDS = 10


def _keys(store: Store, prefix: str, suffix: str) -> list[str]:
    return [k for k in store.list(prefix) if k.endswith(suffix)]


def round_bytes(store: Store) -> int:
    """Bytes of the provider's per-round objects: states and broadcast records."""
    return sum(len(store.get_bytes(k)) for p in ("state/", "broadcast/") for k in store.list(p))


def final_state_bytes(job: JobConfig) -> bytes:
    return layout.JobStores(job).provider().get_bytes(f"{layout.state_key(job.rounds)}.safetensors")


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread, as the crash tests' child processes run: bit-for-bit comparisons of
    runs in one busy process then do not depend on how its threads split a reduction."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> JobConfig:
    """A 10-round run with the default retention."""
    job = parse_job(tiny_job_dict(tmp_path_factory.mktemp("straight"), rounds=ROUNDS))
    run_job(job, NullTracker(), QUIET)
    return job


def test_a_ten_round_run_keeps_only_the_newest_states(straight: JobConfig) -> None:
    assert straight.storage.state_retention == 2  # the default
    provider = layout.JobStores(straight).provider()
    assert _keys(provider, "state/", ".safetensors") == [
        f"{layout.state_key(r)}.safetensors" for r in (ROUNDS - 1, ROUNDS)
    ]
    # Every round's small record stays: metrics, run facts, the mark that the round is done.
    assert _keys(provider, "state/", ".json") == [f"{layout.state_key(r)}.json" for r in range(ROUNDS + 1)]
    assert [k for k in _keys(provider, "broadcast/", ".safetensors") if "final" not in k] == [
        f"{layout.broadcast_key(r)}.safetensors" for r in (ROUNDS - 1, ROUNDS)
    ]
    for tenant in straight.tenants:
        exchange = layout.JobStores(straight).exchange(tenant.name)
        copies = [k for k in _keys(exchange, "", "/broadcast.safetensors") if not k.startswith("final")]
        assert copies == [f"{layout.round_broadcast_key(r)}.safetensors" for r in (ROUNDS - 1, ROUNDS)]
        # The tenants' updates are theirs: every round's stays.
        assert len(_keys(exchange, "", "/update.safetensors")) == ROUNDS


def test_pruning_saves_what_keeping_every_state_costs(straight: JobConfig, tmp_path: Path) -> None:
    everything = parse_job(
        tiny_job_dict(tmp_path / "all", rounds=ROUNDS, storage={"state_retention": ROUNDS + 1})
    )
    run_job(everything, NullTracker(), QUIET)
    kept = layout.JobStores(everything).provider()
    assert len(_keys(kept, "state/", ".safetensors")) == ROUNDS + 1
    pruned = layout.JobStores(straight).provider()
    # The same training: the kept final state is the same bits.
    assert final_state_bytes(everything) == final_state_bytes(straight)
    # 2 of 11 states and 2 of 10 broadcasts, plus every round's small JSON record.
    assert round_bytes(pruned) < 0.3 * round_bytes(kept)


def test_resume_from_the_last_kept_state_is_bitwise_equal(straight: JobConfig, tmp_path: Path) -> None:
    chained = parse_job(tiny_job_dict(tmp_path / "w", rounds=ROUNDS, storage={"state_retention": 1}))
    first = run_job(chained, NullTracker(), RunOptions(progress=False, until_round=6))
    assert not first["completed"]
    provider = layout.JobStores(chained).provider()
    assert _keys(provider, "state/", ".safetensors") == [f"{layout.state_key(6)}.safetensors"]
    second = run_job(chained, NullTracker(), RunOptions(progress=False, resume=True))
    assert second["completed"] and [r["round"] for r in second["rounds"]] == list(range(1, ROUNDS + 1))
    assert final_state_bytes(chained) == final_state_bytes(straight)
    assert _keys(provider, "state/", ".safetensors") == [f"{layout.state_key(ROUNDS)}.safetensors"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "point",
    [
        "stored:summary/round-000003.json",  # newer state and record written, nothing pruned
        "pruning",  # killed after the first deletion
    ],
)
def test_a_kill_between_writing_and_pruning_resumes_to_the_same_state(
    straight: JobConfig, tmp_path: Path, point: str
) -> None:
    job: dict[str, Any] = tiny_job_dict(tmp_path / "w", rounds=ROUNDS)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    killed = run(["run", str(path), "--no-progress"], FEDTUNE_TEST_KILL_AT=point)
    assert killed.returncode == -9, f"{point} was never reached:\n{killed.stderr}"
    provider = layout.JobStores(parse_job(job)).provider()
    left = _keys(provider, "state/", ".safetensors")
    assert left and len(left) <= 3  # the newer state is there; the older ones not yet all gone
    resumed = run(["run", str(path), "--no-progress", "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert final_state_bytes(parse_job(job)) == final_state_bytes(straight)
    assert len(_keys(provider, "state/", ".safetensors")) == 2


def test_state_retention_zero_is_a_config_error(make_job: Callable[..., JobConfig]) -> None:
    with pytest.raises(ConfigError, match="state_retention"):
        make_job(storage={"state_retention": 0})
