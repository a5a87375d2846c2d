"""A FedBiOT round's provider steps on 2 CPU ranks (gloo) against the same steps on 1 rank.

The alignment (pre-distillation in server-init, realignment in aggregate) is the step that
trains on the provider. On 2 ranks each rank takes its rows of every batch, weighs its loss by
its share of the batch's real tokens and the gradients are all-reduced, so the result is the
one-rank result up to float32 summation order: a batch split over two ranks sums two partial
gradients where one rank sums one, and matrix products of 2-3 rows round differently from
those of 5. Those differences are ~1e-8 per step here; ``atol=1e-6, rtol=1e-5`` leaves room
for a few steps of them while a wrong weighting (e.g. plain averaging of the two ranks' token
means, off by the shards' token ratio) moves weights by ~1e-3.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch

from fedtune.config import JobConfig, parse_job
from fedtune.core.errors import QuorumError
from fedtune.core.messages import ServerState
from fedtune.engines import layout
from fedtune.engines.provider import ranks
from fedtune.entrypoints import aggregate, client_step, configure_round, server_init
from tests.integration.conftest import DATA
from tests.kfp.conftest import two_tenant_dict
from tests.kfp.test_kfp_local import FEDBIOT

pytestmark = pytest.mark.slow


def _job(workdir: Path) -> JobConfig:
    return parse_job(
        two_tenant_dict(
            workdir,
            model=FEDBIOT["model"],  # a 4-layer Llama: emulator 1 layer, adapter 1
            algorithm={
                "name": "fedbiot",
                "adapter_size": 1,
                "dropout": 0.5,
                "kl_lambda": 0.5,
                "pre_distill_steps": 3,
                "align_steps": 2,
                # 5 rows per batch: uneven shards (3 and 2 rows) with different token counts.
                "align_batch_size": 5,
                "align_lr": 0.05,
            },
            public_data_uri=str(DATA / "public.jsonl"),
        )
    )


def _until_aggregate(job: JobConfig) -> None:
    server_init.run(job)
    configure_round.run(job, 1)
    for tenant in ("tenant-a", "tenant-b"):
        client_step.run(job, 1, tenant)


def _aggregate(job: JobConfig) -> None:
    aggregate.run(job, 1, {}, [{"round": 1, "tenant": t, "ok": True} for t in ("tenant-a", "tenant-b")])


def _assert_same_state(expected: JobConfig, got: JobConfig, round_index: int) -> None:
    a = ServerState.load(layout.JobStores(expected).provider(), layout.state_key(round_index))
    b = ServerState.load(layout.JobStores(got).provider(), layout.state_key(round_index))
    assert a.tensors.keys() == b.tensors.keys()
    for key, value in a.tensors.items():
        torch.testing.assert_close(b.tensors[key], value, atol=1e-6, rtol=1e-5)
    for name, value in a.meta["metrics"].items():
        assert b.meta["metrics"][name] == pytest.approx(value, rel=1e-5, abs=1e-7), name


def _stored(job: JobConfig) -> dict[str, bytes]:
    store = layout.JobStores(job).provider()
    return {key: store.get_bytes(key) for key in store.list("")}


def test_two_ranks_write_one_state_equal_to_one_rank(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.INFO)  # the ranks log at the launching process's level
    monkeypatch.setenv(ranks.RANKS_ENV, "1")
    one = _job(tmp_path / "one")
    _until_aggregate(one)
    # Round 1's aggregation on 2 ranks starts from the very inputs the 1-rank one gets.
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    two = _job(tmp_path / "two")
    _aggregate(one)
    monkeypatch.setenv(ranks.RANKS_ENV, "2")
    _aggregate(two)
    init_two = _job(tmp_path / "init-two")  # and the pre-distillation of server-init
    server_init.run(init_two)

    expected, got = _stored(one), _stored(two)
    # Exactly the keys a one-rank run writes: one state per step, nothing from rank 1.
    assert sorted(got) == sorted(expected)
    assert sorted(k for k in _stored(init_two) if k.startswith("state/")) == [
        "state/round-000000.json", "state/round-000000.safetensors"
    ]
    provider_one = layout.JobStores(one).provider()
    _assert_same_state(one, init_two, 0)
    _assert_same_state(one, two, 1)
    before = ServerState.load(provider_one, layout.state_key(0)).group("emulator")
    after = ServerState.load(provider_one, layout.state_key(1)).group("emulator")
    moved = max(float((after[k] - before[k]).abs().max()) for k in before)
    assert moved > 1e-3  # realignment moved the emulator: equality above means something

    logs = capfd.readouterr().err
    assert "rank 0/2 fedtune.algorithms.fedbiot.server: pre-distilled the emulator" in logs
    assert "rank 1/2" not in logs  # rank 1 logs nothing (errors only)


def test_a_step_failing_on_every_rank_fails_once_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ranks.RANKS_ENV, "2")
    job = _job(tmp_path / "w")
    server_init.run(job)
    configure_round.run(job, 1)
    before = sorted(_stored(job))
    # Every rank meets the quorum failure; the step reports it once.
    with pytest.raises(QuorumError, match=r"^rank [01] of 2: round 1: 0 valid update\(s\) of 2"):
        _aggregate(job)  # the markers say both delivered; no update is stored
    assert sorted(_stored(job)) == before


def test_two_ranks_under_deepspeed_zero3_equal_one_plain_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ZeRO-3 partitions the trained emulator and the frozen teacher over the 2 ranks."""
    monkeypatch.setenv(ranks.RANKS_ENV, "1")
    plain = _job(tmp_path / "plain")
    server_init.run(plain)
    monkeypatch.setenv(ranks.RANKS_ENV, "2")
    raw = plain.model_dump(mode="json")
    raw["workdir"] = str(tmp_path / "zero3")
    raw["algorithm"]["deepspeed"] = {"zero_stage": 3}
    zero3 = parse_job(raw)
    server_init.run(zero3)
    _assert_same_state(plain, zero3, 0)
    assert sorted(k for k in _stored(zero3) if k.startswith("state/")) == [
        "state/round-000000.json", "state/round-000000.safetensors"
    ]
