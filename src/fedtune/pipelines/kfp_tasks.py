"""Start kfp.local's task processes from a fork server instead of a fresh interpreter each.

``kfp.local.SubprocessRunner`` runs every task as ``sh -ec SCRIPT SOURCE ARGS...``: the script
writes the component's source to a file and starts ``python -m kfp.dsl.executor_main`` on it,
so every task imports kfp, torch, transformers and PEFT again (seconds each, most of a small
job's time). Here the same executor runs in a process forked from a server that imported
those libraries once and never runs tensor work (as :mod:`fedtune.engines.workers` does for
the local engine's workers): each task is still its own process, with its own memory, reading
and writing only the stores and its artifact files, so state flows between tasks exactly as
between pods. Commands of any other shape go to kfp's own subprocess start.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from fedtune.engines import fork_server

#: What the fork server imports once (a task's own step imports the rest, if any; see
#: :mod:`fedtune.engines.fork_server`).
PRELOAD: Final = ["kfp.dsl.executor_main", "torch", "transformers", "peft", "fedtune.models.loading"]
_EXECUTOR: Final = "kfp.dsl.executor_main"


def _is_lightweight(command: list[str]) -> bool:
    return (
        len(command) >= 4
        and command[0] == "sh"
        and command[1] in ("-c", "-ec")
        and "ephemeral_component.py" in command[2]
        and f"-m {_EXECUTOR}" in command[2]
        and "pip install" not in command[2]
    )


def _task_main(source: str, args: list[str], env: dict[str, str], log_path: str) -> None:
    """In the forked process: what the task's shell script does, without a new interpreter."""
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ.clear()  # the engine's environment now, not the fork server's at its start
    os.environ.update(env)
    os.environ["_KFP_RUNTIME"] = "true"
    folder = tempfile.mkdtemp()
    module = Path(folder) / "ephemeral_component.py"
    module.write_text(source, "utf-8")
    sys.argv = [_EXECUTOR, "--component_module_path", str(module), *args]
    try:
        runpy.run_module(_EXECUTOR, run_name="__main__", alter_sys=True)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def run_task(command: list[str], env_vars: dict[str, str] | None = None) -> int:
    """Run one kfp.local task command in a forked process; print its log; its exit code."""
    context = fork_server.context(PRELOAD)
    with tempfile.NamedTemporaryFile(prefix="fedtune-task-", suffix=".log") as log:
        process = context.Process(
            target=_task_main, args=(command[3], command[4:], {**os.environ, **(env_vars or {})}, log.name)
        )
        process.start()
        process.join()
        text = Path(log.name).read_text("utf-8", errors="replace")
    for line in text.splitlines():
        print(line)
    code = int(process.exitcode or 0)
    if code:  # kfp.local reports only FAILURE: say how the process ended, for whoever reads why
        print(f"fedtune: the task's process ended with {_ending(code)}")
    print("\n")
    return code


def _ending(code: int) -> str:
    """``exit status 1`` or, for a process killed by a signal (negative code), its name."""
    if code > 0:
        return f"exit status {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:
        return f"signal {-code}"


@contextmanager
def forked_tasks() -> Iterator[None]:
    """While open, kfp.local starts lightweight-component tasks with :func:`run_task`."""
    from kfp.local import subprocess_task_handler as handler

    original = handler.run_local_subprocess
    fork_server.context(PRELOAD)

    def run(full_command: list[str], env_vars: dict[str, str] | None = None) -> Any:
        if _is_lightweight(full_command):
            return run_task(full_command, env_vars)
        return original(full_command, env_vars)

    handler.run_local_subprocess = run
    try:
        yield
    finally:
        handler.run_local_subprocess = original
