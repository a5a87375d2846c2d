"""Run one untrusted program and report how it ended: the child half of ``fedtune.eval.sandbox``.

Never imported by fedtune. The sandbox starts it as a script in a fresh, isolated interpreter
(``python -I _sandbox_child.py REPORT_FD NONCE_FD PROGRAM``) after the parent has set resource
limits, so it uses the standard library only. It reads a nonce from ``NONCE_FD`` and closes it
before any untrusted code runs, disables network and process creation, executes the program,
and writes one JSON line ``{"status": ..., "detail": ..., "nonce": ...}`` to ``REPORT_FD``.
The status comes from this script reaching its end, not from the exit code: a program that
calls ``sys.exit(0)`` or ``os._exit(0)`` before its tests finish is not a pass, and a report the
program writes itself lacks the nonce.

The guards replace Python-level entry points only. Code that reaches the C level (``ctypes``,
a compiled extension) gets around them: they stop accidents of generated code, not an attacker.
"""

from __future__ import annotations

import builtins
import json
import linecache
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

_DETAIL_LIMIT = 1000

_NETWORK_NAMES = (
    "socket",
    "socketpair",
    "fromfd",
    "create_connection",
    "create_server",
    "getaddrinfo",
    "gethostbyname",
    "gethostbyname_ex",
    "gethostbyaddr",
)
# Spawning a process would escape the socket guard (curl, a fresh python); killing one could
# take down the evaluator, which runs as the same user.
_PROCESS_NAMES = (
    "system",
    "popen",
    "fork",
    "forkpty",
    "posix_spawn",
    "posix_spawnp",
    "execv",
    "execve",
    "execl",
    "execle",
    "execlp",
    "execlpe",
    "execvp",
    "execvpe",
    "spawnv",
    "spawnve",
    "spawnl",
    "spawnle",
    "spawnlp",
    "spawnlpe",
    "spawnvp",
    "spawnvpe",
    "kill",
    "killpg",
)


def _refuse(what: str) -> Callable[..., NoReturn]:
    def refuse(*_args: Any, **_kwargs: Any) -> NoReturn:
        raise PermissionError(f"{what} is disabled in the fedtune evaluation sandbox")

    return refuse


class _RefusedSocket:
    """Stands in for ``socket.socket``: still a class, so modules that subclass it at import
    time (``ssl``, ``urllib``) import cleanly and fail only when they open a connection."""

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        raise PermissionError(
            "network access (socket.socket) is disabled in the fedtune evaluation sandbox"
        )


def _install_guards() -> None:
    import _posixsubprocess
    import _socket
    import socket

    for module in (socket, _socket):
        for name in _NETWORK_NAMES:
            if name == "socket":
                setattr(module, name, _RefusedSocket)
            elif hasattr(module, name):
                setattr(module, name, _refuse(f"network access (socket.{name})"))
        if hasattr(module, "SocketType"):
            setattr(module, "SocketType", _RefusedSocket)  # noqa: B010 - untyped attribute
    # subprocess calls this at call time, so replacing it covers subprocess.Popen and run.
    _posixsubprocess.fork_exec = _refuse("starting processes (subprocess)")
    for name in _PROCESS_NAMES:
        if hasattr(os, name):
            setattr(os, name, _refuse(f"os.{name}"))


def _describe(exc: BaseException, path: str) -> str:
    """``Type: message`` plus the line of the program where it was raised."""
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1]
    line_no = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == path:
            line_no = tb.tb_lineno
        tb = tb.tb_next
    if isinstance(exc, SyntaxError) and exc.lineno is not None:
        line_no = exc.lineno
    if line_no is not None:
        source = linecache.getline(path, line_no).strip()
        text += f" (line {line_no}: {source})"
    return text[:_DETAIL_LIMIT]


def main() -> None:
    """Execute the program named on the command line and report its outcome."""
    report_fd, nonce_fd, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    nonce = os.read(nonce_fd, 64).decode()
    os.close(nonce_fd)
    sys.argv = [path]
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    write, hard_exit = os.write, os._exit
    _install_guards()
    try:
        code = compile(source, path, "exec")
        # Not "__main__": as in the HumanEval harness, `if __name__ == "__main__":` demo
        # blocks of a completion do not run.
        exec(code, {"__name__": "__candidate__", "__builtins__": builtins})  # noqa: S102
    except AssertionError as exc:
        status, detail = "failed", _describe(exc, path)
    except BaseException as exc:  # noqa: BLE001 - any crash, exit or interrupt is a failed run
        status, detail = "error", _describe(exc, path)
    else:
        status, detail = "passed", ""
    report = json.dumps({"status": status, "detail": detail, "nonce": nonce}) + "\n"
    write(report_fd, report.encode("utf-8"))
    # Skip interpreter shutdown: threads the program left running must not delay the exit.
    hard_exit(0)


if __name__ == "__main__":
    main()
