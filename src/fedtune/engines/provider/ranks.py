"""Run a heavy provider step on several ranks: one process per GPU inside the step's pod.

With ``provider.gpu > 1`` (or ``$FEDTUNE_PROVIDER_RANKS``, which also works without GPUs,
over gloo) the step's process starts that many rank processes with torch's elastic launcher
(the machinery behind ``torchrun``, which sets the variables DeepSpeed reads) and waits for
them. Every rank runs the same deterministic step on the same inputs; the training inside it
shards each batch by rank and all-reduces gradients (:mod:`fedtune.training.distributed`),
so all ranks reach the same state. Rank 0 alone writes it; the others write nothing and
return nothing. The launching process then goes on as a one-rank step would: it writes the
round's record, logs to the tracker and writes the step's marker.

A failing rank fails the step: the launcher stops the others, and the step raises the
failing rank's error (its own class, exit code and fix for a :class:`FedtuneError`, else
:class:`RankFailed` with the exception's text; the full traceback is in the step's log).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedtune.core.errors import ConfigError, FedtuneError, RankFailed, error_classes

log = logging.getLogger(__name__)

RANKS_ENV = "FEDTUNE_PROVIDER_RANKS"
"""Rank count of the heavy provider steps, overriding ``provider.gpu`` (CPU ranks use gloo)."""

MAX_RANKS = 16

_HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def provider_ranks(gpu: int) -> int:
    """How many ranks a heavy provider step runs on.

    ``$FEDTUNE_PROVIDER_RANKS`` when set; else ``gpu`` (``provider.gpu``) where that many CUDA
    devices are visible; else 1. A job asking for GPUs on a machine without any (a laptop
    running the cluster's job) runs on one CPU rank.

    Raises:
        ConfigError: The variable is not an integer in 1..16, or ``gpu`` exceeds the
            visible GPUs.
    """
    raw = os.environ.get(RANKS_ENV)
    if raw is not None:
        if not raw.strip().isdigit() or not 1 <= int(raw) <= MAX_RANKS:
            raise ConfigError(
                f"${RANKS_ENV}={raw!r} is not a rank count",
                fix=f"Set it to an integer from 1 to {MAX_RANKS}, or unset it to follow "
                "provider.gpu.",
            )
        return int(raw)
    if gpu <= 1:
        return 1
    import torch

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible == 0:
        log.warning("provider.gpu=%d but no GPU is visible: the step runs on one CPU rank", gpu)
        return 1
    if gpu > visible:
        raise ConfigError(
            f"provider.gpu={gpu} but this pod sees {visible} GPU(s)",
            fix="Request as many GPUs as provider.gpu (the compiled pipeline does), or lower "
            "provider.gpu.",
        )
    return gpu


def launch(size: int, fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn(*args)`` on ``size`` ranks of one process group; return rank 0's result.

    ``fn`` and ``args`` must pickle (they reach spawned processes); ``fn`` runs with the
    process group initialised (NCCL with one GPU per rank, else gloo).

    Raises:
        FedtuneError: The error of the first rank that failed (see the module docstring).
    """
    if os.environ.get("TORCHELASTIC_RUN_ID") or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError(
            f"a {size}-rank step was started inside a launcher (WORLD_SIZE="
            f"{os.environ.get('WORLD_SIZE')!r}): fedtune starts the ranks itself",
            fix="Run the step's entrypoint without torchrun/deepspeed; provider.gpu (or "
            f"${RANKS_ENV}) sets the rank count.",
        )
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from fedtune.training.deepspeed import free_port

    on_gpus = _ranks_on_gpus(size)

    with tempfile.TemporaryDirectory(prefix="fedtune-ranks-") as scratch:
        config = LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=size,
            run_id=uuid.uuid4().hex,
            rdzv_backend="c10d",
            rdzv_endpoint=f"127.0.0.1:{free_port()}",
            max_restarts=0,
            monitor_interval=0.1,
            start_method="spawn",
            logs_specs=DefaultLogsSpecs(log_dir=str(Path(scratch) / "logs")),
        )
        started = time.perf_counter()
        level = logging.getLogger().getEffectiveLevel()
        # The launcher installs its own handlers (SIGTERM ends the ranks); the engine's
        # graceful stop (fedtune.engines.stopping) gets its handlers back afterwards.
        handlers = {sig: signal.getsignal(sig) for sig in _HANDLED}
        try:
            results = elastic_launch(config, _rank)(fn, args, scratch, level, on_gpus)
        except ChildFailedError as failed:
            raise _first_failure(scratch, size, failed) from None
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    log.info("%d ranks finished in %.1f s", size, time.perf_counter() - started)
    return results[0]


def _ranks_on_gpus(size: int) -> bool:
    """Whether ``size`` ranks get a GPU each (NCCL). More ranks than visible GPUs (only
    ``$FEDTUNE_PROVIDER_RANKS`` asks for that: ``provider.gpu`` above the GPUs is refused by
    :func:`provider_ranks`) run on the CPU over gloo, with the GPUs hidden from them: NCCL
    refuses two ranks on one device, and ``cuda:1`` does not exist on a one-GPU machine."""
    import torch

    if not torch.cuda.is_available():
        return False
    visible = torch.cuda.device_count()
    if size > visible:
        log.warning("%d ranks but %d GPU(s) visible: the ranks run on the CPU over gloo",
                    size, visible)
        return False
    return True


def _rank(fn: Callable[..., Any], args: tuple[Any, ...], scratch: str, level: int,
          on_gpus: bool) -> Any:
    """One rank: join the group, run ``fn``, leave; record any error for the launcher."""
    if not on_gpus:
        # Before any CUDA call of this process: the job's "auto" device then resolves to the CPU.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch
    import torch.distributed as dist

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # Rank 0 speaks for the step; the others only report errors.
    logging.basicConfig(
        level=level if rank == 0 else logging.ERROR,
        format=f"%(asctime)s %(levelname)s rank {rank}/{size} %(name)s: %(message)s",
    )
    from fedtune.core import killpoints

    if on_gpus:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
    else:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        from fedtune.core.cpu import threads_for

        # The ranks share the CPUs the step may use rather than each taking all of them.
        torch.set_num_threads(max(1, threads_for() // size))
        dist.init_process_group("gloo")
    try:
        killpoints.reached(f"rank:{rank}")
        result = fn(*args)
    except BaseException as exc:
        # Recorded before leaving the group: the others fail on the closed connection after.
        _record(scratch, rank, exc)
        raise
    finally:
        dist.destroy_process_group()
    return result if rank == 0 else None


def _record(scratch: str, rank: int, exc: BaseException) -> None:
    """Leave what the launcher needs to re-raise this rank's error."""
    record = {
        "rank": rank,
        "time": time.time(),
        "type": type(exc).__name__,
        "message": str(exc),
        "fix": exc.fix if isinstance(exc, FedtuneError) else None,
        "traceback": "".join(traceback.format_exception(exc)[-3:]),
    }
    Path(scratch, f"error-{rank}.json").write_text(json.dumps(record), "utf-8")


def _first_failure(scratch: str, size: int, failed: Any) -> FedtuneError:
    """The error of the rank that failed first (the others' often follow from it).

    A rank killed by a signal leaves no record, and the others then fail on its closed
    connection: such a rank is the cause, unless the signal is the launcher's own SIGTERM
    that stops the survivors of another rank's failure.
    """
    records = [json.loads(p.read_text("utf-8")) for p in Path(scratch).glob("error-*.json")]
    recorded = {r["rank"] for r in records}
    killed = {
        rank: failure
        for rank, failure in failed.failures.items()
        if rank not in recorded
        and (failure.exitcode >= 0 or not records or failure.signal_name() != "SIGTERM")
    }
    if killed:
        rank, failure = min(killed.items())
        how = (
            f"was killed by signal {failure.signal_name()}"
            if failure.exitcode < 0
            else f"exited with code {failure.exitcode}"
        )
        return RankFailed(f"rank {rank} of {size} {how} before finishing the step")
    first = min(records, key=lambda r: (r["time"], r["rank"]))
    where = f"rank {first['rank']} of {size}"
    kind = error_classes().get(first["type"])
    if kind is None:
        return RankFailed(f"{where} failed: {first['type']}: {first['message']}")
    try:
        return kind(f"{where}: {first['message']}", fix=first["fix"])
    except TypeError:  # a class that needs more than a message: keep its exit code
        exc = RankFailed(f"{where}: {first['type']}: {first['message']}", fix=first["fix"])
        exc.exit_code = kind.exit_code
        return exc


def provider_step(env: Any, step: str, *args: Any) -> dict[str, Any]:
    """``steps.<step>_step(env, *args)`` on the job's provider ranks (in-process for one).

    Args:
        env: The step's :class:`~fedtune.engines.steps.ProviderEnv`.
        step: ``"init"`` or ``"aggregate"``, the steps that train on the provider.
        args: The step function's arguments after ``env``.
    """
    size = provider_ranks(env.job.provider.gpu)
    if size == 1:
        return _function(step)(env, *args)
    log.info("running the %s step on %d ranks", step, size)
    return launch(size, _step_in_rank, env.job, step, args)  # type: ignore[no-any-return]


def _step_in_rank(job: Any, step: str, args: tuple[Any, ...]) -> dict[str, Any]:
    from fedtune.engines.steps import ProviderEnv

    return _function(step)(ProviderEnv.create(job), *args)


def _function(step: str) -> Callable[..., dict[str, Any]]:
    from fedtune.engines import steps

    table: dict[str, Callable[..., dict[str, Any]]] = {
        "init": steps.init_step,
        "aggregate": steps.aggregate_step,
    }
    return table[step]
