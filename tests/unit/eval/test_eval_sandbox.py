"""The sandbox's limits and outcomes, on plain programs."""

from __future__ import annotations

import time

import pytest

from fedtune.core.errors import ConfigError
from fedtune.eval.sandbox import SandboxLimits, run_program


def test_a_plain_program_passes() -> None:
    result = run_program("x = sum(range(10))\nassert x == 45\n")
    assert (result.passed, result.status, result.detail) == (True, "passed", "")


def test_writing_a_huge_file_fails() -> None:
    program = "with open('big.bin', 'wb') as f:\n    f.write(b'x' * (4 * 1024 * 1024))\n"
    limited = run_program(program, SandboxLimits(file_size_mb=1))
    assert limited.status == "error" and "File too large" in limited.detail
    assert run_program(program, SandboxLimits(file_size_mb=8)).passed


def test_a_crash_by_signal_is_an_error() -> None:
    result = run_program("import signal\nsignal.raise_signal(signal.SIGABRT)\n")
    assert (result.passed, result.status) == (False, "error")
    assert "killed by SIGABRT" in result.detail


def test_reading_stdin_gets_nothing() -> None:
    result = run_program("input()\n")
    assert result.status == "error" and "EOFError" in result.detail


def test_threads_left_running_do_not_delay_the_result() -> None:
    program = "import threading, time\nthreading.Thread(target=time.sleep, args=(30,)).start()\n"
    start = time.monotonic()
    result = run_program(program, SandboxLimits(timeout_s=20))
    assert result.passed
    assert time.monotonic() - start < 15


def test_invalid_limits_are_listed_together() -> None:
    with pytest.raises(ConfigError, match=r"timeout_s=-1.*memory_mb=8.*file_size_mb=0"):
        SandboxLimits(timeout_s=-1, memory_mb=8, file_size_mb=0)
