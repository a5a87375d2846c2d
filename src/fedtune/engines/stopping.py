"""SIGTERM and SIGINT stop a run at the next safe point instead of at once.

Kubernetes sends SIGTERM, a terminal Ctrl-C sends SIGINT. The first signal only sets a
flag; the engine calls :func:`check` between steps and stops there, so the tracker can mark
the run KILLED and the user learns how to resume. A second signal stops at once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from fedtune.core.errors import StopRequested

_received: list[int] = []


def _handle(signum: int, frame: FrameType | None) -> None:
    if _received:  # the second signal: stop now, wherever the run is
        raise StopRequested.for_signal(signum, "at once (second signal)")
    _received.append(signum)


@contextmanager
def graceful_stop() -> Iterator[None]:
    """Within this block SIGTERM and SIGINT request a stop at the next :func:`check`."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be installed from the main thread
        return
    _received.clear()
    previous = {s: signal.signal(s, _handle) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _received.clear()


def check(where: str) -> None:
    """Raise :class:`StopRequested` if a stop signal arrived; ``where`` names the safe point."""
    if _received:
        raise StopRequested.for_signal(_received[0], where)
