"""Worker processes die with the engine that started them, even when it is SIGKILLed.

A killed ``fedtune run --workers N`` ran no cleanup: its fork server went on importing
torch and its workers went on training for seconds. Two guards close that:

* a worker asks the kernel for SIGKILL when its parent dies (Linux ``prctl`` with
  ``PR_SET_PDEATHSIG``). Its parent is the fork server, not the engine, and the signal fires
  when the parent *thread* ends; the fork server forks from its single main thread, so
  that thread's end is the fork server's end.
* the fork server (whose parent thread in the engine may be a short-lived start thread, so
  the signal would fire too early) watches its parent instead: once it is orphaned it kills
  itself, and with it, by the workers' signal, every worker. Idle, it also ends on its own
  (its ``alive`` pipe closes); the watch covers the seconds it spends importing torch first.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCH_INTERVAL_S = 0.05
ENGINE_PID_ENV = "FEDTUNE_ENGINE_PID"  # the fork server's parent, set by the engine


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` to this process when its parent thread ends.

    Returns False where there is no such signal (not Linux); the caller's other guards
    (a closed pipe) then end it later.

    Raises:
        OSError: ``prctl`` refused.
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}")
    return True


def die_with_parent() -> None:
    """In a worker: die with the fork server (or engine) that started it.

    The parent may have died between the fork and the ``prctl`` call, when no signal would
    come any more: then the engine (multiprocessing's parent process) is gone too, and this
    process ends at once.
    """
    set_parent_death_signal()
    parent = multiprocessing.parent_process()
    if parent is not None and not parent.is_alive():
        os.kill(os.getpid(), signal.SIGKILL)


def exit_when_orphaned(interval_s: float = WATCH_INTERVAL_S) -> threading.Thread:
    """Watch this process's parent from a daemon thread; SIGKILL this process once it is gone.

    The parent is the engine named by ``$FEDTUNE_ENGINE_PID`` (:func:`name_engine` sets it
    before starting the fork server), else the parent seen now; orphaned means that
    ``getppid()`` no longer names it, which covers an engine killed before this ran.
    """
    parent = int(os.environ.get(ENGINE_PID_ENV) or os.getppid())

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="fedtune-parent-watch", daemon=True)
    thread.start()
    return thread


def name_engine() -> None:
    """In the engine, before it starts the fork server: name itself as the parent to watch."""
    os.environ[ENGINE_PID_ENV] = str(os.getpid())
