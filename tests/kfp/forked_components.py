"""Tiny components for the forked-task tests: one writes a file, one fails loudly, one is
killed by a signal.

No ``from __future__ import annotations``: kfp reads the parameter annotations as types.
"""

from kfp import dsl


@dsl.component(install_kfp_package=False)
def write_pid(path: str) -> str:
    """Write this task's process id, its runtime flag and whether torch was already imported
    (it is in a process forked from the warm server) to ``path``; return a greeting."""
    import os
    import sys

    with open(path, "w") as out:
        out.write(f"{os.getpid()} {os.environ.get('_KFP_RUNTIME')} {'torch' in sys.modules}")
    return "hello from a forked task"


@dsl.component(install_kfp_package=False)
def fail(message: str) -> None:
    """Raise ``message``."""
    raise ValueError(message)


@dsl.component(install_kfp_package=False)
def killed() -> None:
    """End this task's process with SIGKILL, as the out-of-memory killer would."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
