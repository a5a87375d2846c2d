"""Progress of long work inside a tenant's step (e.g. FewFedPIT's generation).

A step asks its context for a bar: ``with ctx.progress("tenant-a: synthetic data", 96) as
advance: ... advance(8)``. The local engine shows it as a rich bar under the round's; a pod
(or a worker process) logs the start and the end, so tenant logs stay in the tenant's pod.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import Progress

log = logging.getLogger(__name__)

Advance = Callable[[int], None]
ProgressHook = Callable[[str, int], AbstractContextManager[Advance]]


@contextmanager
def logged_progress(description: str, total: int) -> Iterator[Advance]:
    """The default hook: a log line when the work starts and one when it ends."""
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        done += n

    started = time.perf_counter()
    log.info("%s: started (%d units)", description, total)
    yield advance
    log.info("%s: %d units in %.1f s", description, done, time.perf_counter() - started)


def rich_progress(bar: Progress) -> ProgressHook:
    """A hook that adds a task to a rich ``Progress`` for the work's duration."""

    @contextmanager
    def hook(description: str, total: int) -> Iterator[Advance]:
        task = bar.add_task(description, total=total)
        try:
            yield lambda n: bar.advance(task, n)
        finally:
            bar.remove_task(task)

    return hook
