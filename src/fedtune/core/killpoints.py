"""Named moments where tests kill the process, as a crash there would.

``FEDTUNE_TEST_KILL_AT=<point>`` makes :func:`reached` SIGKILL the process at that point;
unset (always, outside tests) it does nothing.
"""

from __future__ import annotations

import os
import signal

ENV = "FEDTUNE_TEST_KILL_AT"


def reached(point: str) -> None:
    """SIGKILL this process if ``FEDTUNE_TEST_KILL_AT`` names ``point``."""
    if os.environ.get(ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)
