"""Execute generated Python code in a separate, limited process.

Each program runs in a fresh interpreter (``sys.executable -I``: no user site, no ``PYTHON*``
variables, no script folder on ``sys.path``) started in its own session, with

- a fresh temporary directory as working directory, ``HOME`` and ``TMPDIR``;
- an environment stripped to ``PATH``, ``LANG``, ``HOME``, ``TMPDIR`` and single-thread BLAS
  settings (no credentials, nothing of the evaluator's);
- resource limits set in ``preexec_fn``: address space (``RLIMIT_AS``), CPU seconds
  (``RLIMIT_CPU``), size of any file it writes (``RLIMIT_FSIZE``), no core dumps;
- a wall-time limit, after which its whole process group is killed;
- Python-level guards (see ``_sandbox_child.py``) that make socket creation, name resolution,
  process creation and ``os.kill`` raise ``PermissionError``.

This is a **best-effort guard against accidents of generated code, not a security boundary**:
``ctypes`` or a compiled extension gets around the Python-level guards, and a process running
as root may raise its own hard limits. On the cluster the evaluation pod's NetworkPolicy (no
egress), its non-root user and its resource limits are the real boundary; never run untrusted
completions on a machine holding credentials without them.

POSIX only (``resource``, process groups). ``preexec_fn`` is documented as unsafe with threads
because the forked child may inherit a lock held by another thread; the function used here
only calls ``setrlimit`` and touches no Python-level lock, which keeps the worker threads of
:func:`fedtune.eval.humaneval.evaluate_samples` safe.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from fedtune.core.errors import ConfigError

logger = logging.getLogger(__name__)

Status = Literal["passed", "failed", "timeout", "error"]
_CHILD = Path(__file__).with_name("_sandbox_child.py")
_DETAIL_LIMIT = 1000
_STDERR_TAIL = 600


@dataclass(frozen=True)
class CheckResult:
    """How one program run ended.

    Attributes:
        passed: True only when the program ran to the end without an exception.
        status: ``passed``; ``failed`` (an ``AssertionError``: a test did not hold);
            ``timeout`` (the wall-time or CPU-time limit was hit); ``error`` (any other
            exception, a syntax error, an exit before the end, or a crash).
        detail: A one-line explanation for logs; empty when passed.
    """

    passed: bool
    status: Status
    detail: str


@dataclass(frozen=True)
class SandboxLimits:
    """Limits for one run.

    Attributes:
        timeout_s: Wall-clock seconds before the process group is killed; the CPU-time limit
            is this rounded up plus one second.
        memory_mb: Address-space limit of the interpreter, in MiB (Python itself needs ~30).
        file_size_mb: Largest file the program may write, its stderr included, in MiB.
    """

    timeout_s: float = 5.0
    memory_mb: int = 1024
    file_size_mb: int = 8

    def __post_init__(self) -> None:
        problems = []
        if not self.timeout_s > 0:
            problems.append(f"timeout_s={self.timeout_s} must be > 0")
        if self.memory_mb < 64:
            problems.append(f"memory_mb={self.memory_mb} must be >= 64 (the interpreter needs it)")
        if self.file_size_mb < 1:
            problems.append(f"file_size_mb={self.file_size_mb} must be >= 1")
        if problems:
            raise ConfigError(
                "invalid sandbox limits: " + "; ".join(problems),
                fix="Use a positive timeout, memory_mb >= 64 and file_size_mb >= 1.",
            )


def _apply_limits(cpu_s: int, memory_bytes: int, file_bytes: int) -> None:
    """Runs in the forked child before exec: calls into C only, takes no Python lock."""
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone


def _stderr_tail(handle: IO[bytes]) -> str:
    handle.seek(0, os.SEEK_END)
    size = handle.tell()
    handle.seek(max(0, size - _STDERR_TAIL))
    raw = handle.read()
    return " ".join(raw.decode("utf-8", errors="replace").split())


def run_program(program: str, limits: SandboxLimits | None = None) -> CheckResult:
    """Run ``program`` (Python source) in the sandbox and report how it ended.

    Args:
        program: Complete Python source; raising ``AssertionError`` means a test failed.
        limits: Resource limits; the defaults of :class:`SandboxLimits` when None.

    Returns:
        The outcome. Problems of the program never raise; they are the result.
    """
    limits = limits or SandboxLimits()
    cpu_s = math.ceil(limits.timeout_s) + 1
    preexec = functools.partial(
        _apply_limits, cpu_s, limits.memory_mb * 2**20, limits.file_size_mb * 2**20
    )
    read_fd, write_fd = os.pipe()
    try:
        with (
            tempfile.TemporaryDirectory(
                prefix="fedtune-sandbox-", ignore_cleanup_errors=True
            ) as tmp,
            tempfile.TemporaryFile() as stderr,
        ):
            program_path = Path(tmp) / "program.py"
            program_path.write_text(program, encoding="utf-8")
            env = {
                "PATH": os.defpath,
                "LANG": "C.UTF-8",
                "HOME": tmp,
                "TMPDIR": tmp,
                # One BLAS thread: OpenBLAS reserves memory per thread, which on a many-core
                # node can exceed the address-space limit when a completion imports numpy.
                "OPENBLAS_NUM_THREADS": "1",
                "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
            }
            # The argv is ours; the untrusted program is only a file the child reads.
            proc = subprocess.Popen(
                [sys.executable, "-I", str(_CHILD), str(write_fd), str(program_path)],
                cwd=tmp,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                pass_fds=(write_fd,),
                start_new_session=True,
                preexec_fn=preexec,  # noqa: PLW1509 - thread safety: see the module docstring
            )
            os.close(write_fd)
            write_fd = -1
            try:
                returncode = proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid)
                proc.wait()
                return CheckResult(
                    False, "timeout", f"exceeded the wall-time limit of {limits.timeout_s:g} s"
                )
            finally:
                # Whatever it left behind (it cannot fork, but be thorough) dies with it.
                _kill_group(proc.pid)
            report = _read_report(read_fd)
            return _classify(returncode, report, _stderr_tail(stderr), cpu_s)
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)


def _read_report(read_fd: int) -> dict[str, str] | None:
    # Non-blocking: a lingering grandchild could hold the write end open forever.
    os.set_blocking(read_fd, False)
    try:
        raw = os.read(read_fd, 1 << 16)
    except BlockingIOError:
        return None
    try:
        report = json.loads(raw.decode("utf-8").splitlines()[0])
    except (ValueError, IndexError):
        return None
    if not isinstance(report, dict) or report.get("status") not in ("passed", "failed", "error"):
        return None
    return {"status": str(report["status"]), "detail": str(report.get("detail", ""))}


def _classify(
    returncode: int, report: dict[str, str] | None, stderr: str, cpu_s: int
) -> CheckResult:
    if report is not None:
        status = report["status"]
        detail = report["detail"][:_DETAIL_LIMIT]
        if status == "passed":
            return CheckResult(True, "passed", "")
        return CheckResult(False, "failed" if status == "failed" else "error", detail)
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        # SIGXCPU at the soft CPU limit, SIGKILL at the hard one a second later.
        return CheckResult(False, "timeout", f"exceeded the CPU-time limit of {cpu_s} s")
    if returncode < 0:
        name = signal.Signals(-returncode).name
        detail = f"killed by {name}" + (f"; stderr: {stderr}" if stderr else "")
        return CheckResult(False, "error", detail[:_DETAIL_LIMIT])
    detail = f"exited with code {returncode} before the program finished"
    if stderr:
        detail += f"; stderr: {stderr}"
    return CheckResult(False, "error", detail[:_DETAIL_LIMIT])
