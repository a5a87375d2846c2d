"""The fork server that the worker pool and kfp-local's tasks fork from: what it imports once.

Both start their processes from multiprocessing's fork server, so each process starts with
the libraries already imported instead of importing them for seconds. It imports, once:

* first the guard that ends it with the engine (:mod:`fedtune.engines.parent_death`);
* the modules the caller names (torch, transformers, PEFT and the fedtune modules that use
  them: the steps import them lazily, so naming only the steps left every worker importing
  transformers and PEFT itself, on every core at once);
* the engine's own main module when it is a fedtune module (``python -m fedtune.cli.main``):
  multiprocessing re-runs the parent's main module in every child, and that module's imports
  are then already done (a fraction of a second per task otherwise).

:func:`start_early` starts the server before the engine imports its own libraries, so that
its imports overlap the engine's.
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Sequence
from typing import Any, Final

from fedtune.engines.parent_death import name_engine

GUARD: Final = "fedtune.engines.forkserver_guard"


def preloads(modules: Sequence[str]) -> list[str]:
    """What the fork server imports: the guard, ``modules``, the engine's fedtune main module."""
    main = getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None)
    own_main = [main] if isinstance(main, str) and main.startswith("fedtune.") else []
    return list(dict.fromkeys([GUARD, *modules, *own_main]))


def context(modules: Sequence[str]) -> Any:
    """The fork-server start context, the server preloading :func:`preloads` (``modules``)
    when it starts; spawn where the platform has no fork server."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")  # pragma: no cover - Windows
    forkserver = multiprocessing.get_context("forkserver")
    forkserver.set_forkserver_preload(preloads(modules))
    name_engine()  # the fork server it starts watches this process
    return forkserver


def start_early(modules: Sequence[str]) -> None:
    """Start the fork server now (it imports in the background; the first process started
    from it waits for that); nothing where there is no fork server."""
    if context(modules).get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()
