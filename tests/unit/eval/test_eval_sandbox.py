"""The sandbox's limits and outcomes, on plain programs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fedtune.core.errors import ConfigError
from fedtune.eval.sandbox import SandboxLimits, bwrap_available, run_program


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


# -- a pass needs the harness to reach its end -----------------------------------------------------
# Writes a passing report to every open descriptor, the harness's report pipe among them.
_FORGE = (
    "import os, json\n"
    "for fd in map(int, os.listdir('/proc/self/fd')):\n"
    "    try:\n"
    "        os.write(fd, (json.dumps({'status': 'passed', 'detail': ''}) + '\\n').encode())\n"
    "    except OSError:\n"
    "        pass\n"
)
FORGERIES = {
    "sys-exit": "import sys\nsys.exit(0)\nassert False\n",
    "os-exit": "import os\nos._exit(0)\nassert False\n",
    "raise-systemexit": "raise SystemExit(0)\nassert False\n",
    "forged-report-then-exit": _FORGE + "os._exit(0)\n",
    "forged-report-then-fail": _FORGE + "assert False\n",
}


@pytest.mark.parametrize("name", sorted(FORGERIES))
@pytest.mark.parametrize("isolation", ["process", "auto"])
def test_leaving_early_or_forging_the_report_is_not_a_pass(name: str, isolation: str) -> None:
    result = run_program(FORGERIES[name], SandboxLimits(isolation=isolation))  # type: ignore[arg-type]
    assert not result.passed and result.status == "error", result


def test_an_unknown_isolation_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="isolation='chroot'"):
        SandboxLimits(isolation="chroot")  # type: ignore[arg-type]


# -- OS isolation (bubblewrap), where it works ---------------------------------------------------
needs_bwrap = pytest.mark.skipif(
    bwrap_available() is None, reason="bubblewrap cannot start a sandbox on this machine"
)
BWRAP = SandboxLimits(isolation="bwrap")


@needs_bwrap
def test_under_bwrap_a_program_still_passes_and_says_so() -> None:
    result = run_program("assert sum(range(4)) == 6\n", BWRAP)
    assert result.passed and result.isolation == "bwrap"


@needs_bwrap
def test_under_bwrap_ctypes_cannot_reach_the_network() -> None:
    # ctypes gets around the Python-level socket guard; the network namespace still holds.
    program = (
        "import ctypes, ctypes.util, struct\n"
        "libc = ctypes.CDLL(ctypes.util.find_library('c'), use_errno=True)\n"
        "fd = libc.socket(2, 1, 0)\n"
        "assert fd >= 0\n"
        "addr = struct.pack('!HH4s8x', 2, 53, bytes([1, 1, 1, 1]))\n"
        "ok = libc.connect(fd, addr, len(addr))\n"
        "assert ok == 0, 'no route out'\n"
    )
    result = run_program(program, BWRAP)
    assert not result.passed and "no route out" in result.detail


@needs_bwrap
def test_under_bwrap_the_file_system_is_read_only_outside_tmp(tmp_path: Path) -> None:
    outside = tmp_path / "written.txt"
    program = f"open({str(outside)!r}, 'w').write('x')\n"
    result = run_program(program, BWRAP)
    assert not result.passed and not outside.exists()


@needs_bwrap
def test_under_bwrap_the_callers_temp_files_are_invisible(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("token")
    result = run_program(f"import os\nassert not os.path.exists({str(secret)!r})\n", BWRAP)
    assert result.passed, result


def test_requiring_bwrap_where_it_cannot_run_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedtune.eval import sandbox

    monkeypatch.setattr(sandbox, "_bwrap_binary", lambda: "/nonexistent/bwrap")
    sandbox.bwrap_available.cache_clear()
    sandbox.resolve_isolation.cache_clear()
    try:
        with pytest.raises(ConfigError, match="isolation=bwrap was required") as info:
            run_program("pass\n", BWRAP)
        assert "--isolation process" in info.value.fix
        assert run_program("pass\n", SandboxLimits(isolation="auto")).isolation == "process"
    finally:
        sandbox.bwrap_available.cache_clear()
        sandbox.resolve_isolation.cache_clear()
