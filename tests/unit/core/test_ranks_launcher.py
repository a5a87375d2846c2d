"""The launcher of multi-rank provider steps: rank 0's result, and a failing rank's error.

Two CPU ranks over gloo; the functions they run import no model code (a few seconds each).
"""

from __future__ import annotations

import pytest

from fedtune.core.errors import ConfigError, DataError, RankFailed
from fedtune.engines.provider import ranks
from tests.helpers import ranks as rank_functions


def test_two_ranks_join_one_group_and_rank_zero_answers() -> None:
    assert ranks.launch(2, rank_functions.rank_sum) == {"rank": 0.0, "sum": 3.0}


def test_a_rank_that_raises_fails_the_step_with_its_error() -> None:
    with pytest.raises(RankFailed, match=r"rank 1 of 2 failed: ValueError: boom in rank 1") as info:
        ranks.launch(2, rank_functions.fail_on_rank_one, "bug")
    assert info.value.exit_code == RankFailed.exit_code == 15


def test_a_fedtune_error_on_a_rank_keeps_its_kind_exit_code_and_fix() -> None:
    with pytest.raises(DataError, match=r"^rank 1 of 2: record 3 has no 'output'$") as info:
        ranks.launch(2, rank_functions.fail_on_rank_one, "fedtune")
    assert info.value.exit_code == DataError.exit_code and info.value.fix == "Add the field."


def test_a_killed_rank_fails_the_step_naming_the_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDTUNE_TEST_KILL_AT", "rank:1")  # as the kernel's OOM killer would
    with pytest.raises(RankFailed, match=r"rank 1 of 2 was killed by signal SIGKILL"):
        ranks.launch(2, rank_functions.rank_sum)


def test_the_rank_count_comes_from_the_variable_or_visible_gpus(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(ranks.RANKS_ENV, raising=False)
    assert ranks.provider_ranks(0) == 1 and ranks.provider_ranks(1) == 1
    import torch

    if not torch.cuda.is_available():
        assert ranks.provider_ranks(4) == 1
        assert "provider.gpu=4 but no GPU is visible" in caplog.text
    monkeypatch.setenv(ranks.RANKS_ENV, "2")
    assert ranks.provider_ranks(0) == 2
    for bad in ("0", "17", "two", "-1"):
        monkeypatch.setenv(ranks.RANKS_ENV, bad)
        with pytest.raises(ConfigError, match=rf"FEDTUNE_PROVIDER_RANKS='{bad}' is not a rank count"):
            ranks.provider_ranks(0)


def test_a_step_already_under_a_launcher_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="fedtune starts the ranks itself"):
        ranks.launch(2, rank_functions.rank_sum)


def test_the_launcher_gives_the_callers_signal_handlers_back() -> None:
    import signal

    def mine(signum: int, frame: object) -> None:  # pragma: no cover - never delivered
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        ranks.launch(2, rank_functions.rank_sum)
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)
