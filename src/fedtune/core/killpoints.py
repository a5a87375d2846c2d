"""Named moments where tests kill the process, as a crash there would.

``FEDTUNE_TEST_KILL_AT=<point>`` makes :func:`reached` SIGKILL the process at that point,
and ``FEDTUNE_TEST_KILL_AT=stored:<key suffix>`` makes :func:`stored` do so right after a
store has completely written a key ending so (every step boundary is such a write). Unset
(always, outside tests) they do nothing.
"""

from __future__ import annotations

import os
import signal

ENV = "FEDTUNE_TEST_KILL_AT"


def reached(point: str) -> None:
    """SIGKILL this process if ``FEDTUNE_TEST_KILL_AT`` names ``point``."""
    if os.environ.get(ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)


def stored(name: str) -> None:
    """SIGKILL this process if ``FEDTUNE_TEST_KILL_AT`` is ``stored:<suffix>`` of ``name``."""
    point = os.environ.get(ENV, "")
    if point.startswith("stored:") and name.endswith(point.removeprefix("stored:")):
        os.kill(os.getpid(), signal.SIGKILL)
