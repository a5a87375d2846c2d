"""Long-lived worker processes that run the sampled tenants' steps of a round at once.

The local engine hands a round's client steps (and the final evaluations) to a pool of
worker processes. They are not forked from the engine, whose CUDA and OpenMP state would not
survive that: a fork server (a fresh process that imported torch, transformers and PEFT once
and runs no tensor work) forks them, so each starts in milliseconds instead of importing the
libraries again; where there is no fork server, they are spawned. A worker serves one
tenant's step at a time and keeps nothing of one tenant for the next
(:class:`~fedtune.engines.steps.TenantEnvs`): that tenant's data, encodings and context go,
and the LoRA weights it trained are reset. What stays warm across rounds and tenants is what
every tenant may read: the tokenizer, the frozen tenant-readable base model and its PEFT
wrapper. A tenant's own model (FedMKT's) is that tenant's: it stays, its adapter reset, for
that tenant's next step on the same worker, and goes when the worker serves another tenant
(the pool hands out a round's tasks in the same order, so a tenant tends to meet its worker
again). Workers
run the very step functions of the sequential engine against the same stores, every seed is
derived as there, and the provider aggregates in sorted tenant order: a run with N workers is
bitwise equal to a run with one. Where the algorithm allows it, a round's client steps are
shared evenly over the workers (:func:`share_steps`): a tenant's local training may run in two
parts on two workers, one after the other, which changes where its steps run but not what
they compute.

With GPUs, worker ``i`` is pinned to the device :func:`device_plan` gives it (one per device,
or ``workers_per_device`` sharing one, each with that fraction of its memory); it pins it
before any CUDA work, which the fork server never does. Each reply carries the worker's peak
memory, which the run summary lists per worker.

A worker that dies (killed, out of memory) costs only the update of the tenant it was running,
which is rejected with the reason; a fresh worker takes its place. Messages between the engine
and its workers are JSON, like everything else that crosses a process boundary in fedtune.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any, Final

from fedtune.config.job import JobConfig
from fedtune.core.cpu import threads_for, usable_cpus
from fedtune.core.devices import cuda_device_count
from fedtune.core.errors import ConfigError, FedtuneError
from fedtune.engines import fork_server
from fedtune.engines.parent_death import die_with_parent
from fedtune.engines.tenant.tasks import TenantKind

if TYPE_CHECKING:
    from fedtune.engines.tenant.env import TenantEnvs

log = logging.getLogger(__name__)

TaskKind = TenantKind
FAULT_ENV = "FEDTUNE_WORKER_FAULT"
"""Fault injection for tests: ``kind:round:tenant`` makes the worker running it die (SIGKILL)."""
_MEMORY_PER_WORKER = 2 * 2**30  # a conservative floor for a worker with a small base model


@dataclass(frozen=True)
class Task:
    """One tenant step for a worker; a client step may be a part, local steps
    ``start`` to ``stop`` (see :func:`fedtune.engines.steps.client_step_part`)."""

    kind: TaskKind
    round_index: int
    tenant: str
    start: int = 0
    stop: int | None = None

    @property
    def part(self) -> bool:
        """Whether this is a part of a client step rather than all of it."""
        return bool(self.start) or self.stop is not None


@dataclass(frozen=True)
class Outcome:
    """What became of a task: the step's result, or the reason it produced none."""

    task: Task
    result: dict[str, Any] | None = None
    failure: str | None = None


def resolve_workers(requested: int | str) -> int:
    """The number of workers: ``auto`` = one per usable CPU (quota and affinity, see
    :mod:`fedtune.core.cpu`), capped by available memory.

    Raises:
        ConfigError: ``requested`` is neither ``auto`` nor a positive integer.
    """
    if requested == "auto":
        cores = usable_cpus()
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            available = _MEMORY_PER_WORKER * (cores or 1)
        return max(1, min(cores or 1, available // _MEMORY_PER_WORKER))
    if isinstance(requested, int) and requested >= 1:
        return requested
    raise ConfigError(
        f"workers={requested!r} is not a positive number or auto",
        fix="Pass --workers N (N >= 1) or --workers auto.",
    )


def device_plan(
    setting: str | Sequence[int], workers: int, per_device: int, device_count: int
) -> list[str]:
    """Worker ``i``'s device (``cpu`` or ``cuda:K``), for ``engine.worker_devices`` =
    ``setting`` when CUDA reports ``device_count`` devices: the listed devices (auto: all)
    in turn, ``per_device`` workers on each. ``auto`` without a GPU, and ``cpu``, mean CPU.

    Raises:
        ConfigError: a listed device does not exist, or more workers than device slots.
    """
    if setting == "cpu" or (setting == "auto" and device_count == 0):
        return ["cpu"] * workers
    devices = list(range(device_count)) if setting == "auto" else list(setting)
    missing = [d for d in devices if d >= device_count]  # type: ignore[operator]  # str: auto/cpu only
    if missing:
        raise ConfigError(
            f"engine.worker_devices={devices} names CUDA device(s) {missing}, but CUDA "
            f"reports {device_count} device(s) here",
            fix=f"List device indices below {device_count}, or set worker_devices to auto or cpu.",
        )
    slots = len(devices) * per_device
    if workers > slots:
        raise ConfigError(
            f"{workers} workers do not fit on CUDA device(s) {devices} with "
            f"workers_per_device={per_device} ({slots} slot(s))",
            fix="Use fewer workers, raise engine.workers_per_device, or list more devices.",
        )
    return [f"cuda:{devices[i // per_device]}" for i in range(workers)]


def pool_plan(job: JobConfig, requested: int | str) -> list[str]:
    """The device of every worker for ``requested`` workers (its length is the pool size):
    ``auto`` workers on GPUs are capped at the device slots."""
    size = resolve_workers(requested)
    engine = job.engine
    count = 0 if engine.worker_devices == "cpu" else cuda_device_count()
    if requested == "auto" and engine.worker_devices != "cpu" and count:
        devices = engine.worker_devices
        size = min(size, (count if devices == "auto" else len(devices)) * engine.workers_per_device)
    return device_plan(engine.worker_devices, size, engine.workers_per_device, count)


def visible_devices(device: str, inherited: str | None) -> str:
    """CUDA_VISIBLE_DEVICES that shows a worker only ``device`` (``cuda:K``, K counted among
    the ``inherited`` visible devices, as the engine counted them)."""
    index = int(device.split(":", 1)[1])
    if inherited:
        return inherited.split(",")[index].strip()
    return str(index)


def _pin_device(device: str, per_device: int) -> None:
    """Pin this worker to ``device`` before any CUDA work (the fork server did none)."""
    if device == "cpu":
        # training.device: auto then means this worker's CPU, whatever GPUs the machine has.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        return
    os.environ["CUDA_VISIBLE_DEVICES"] = visible_devices(
        device, os.environ.get("CUDA_VISIBLE_DEVICES")
    )
    import torch

    torch.cuda.set_device(0)
    if per_device > 1:
        torch.cuda.set_per_process_memory_fraction(1 / per_device, 0)


def peak_memory(device: str) -> dict[str, float]:
    """This process's peak resident memory (and peak CUDA allocation on a GPU), in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    out = {"peak_rss_mib": peak / (2**20 if sys.platform == "darwin" else 2**10)}
    if device != "cpu":
        import torch

        out["peak_cuda_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return out


#: What the fork server imports once for every worker it forks (see the module docstring and
#: :mod:`fedtune.engines.fork_server`): the libraries of a tenant's steps.
PRELOAD: Final = ["torch", "fedtune.engines.steps", "fedtune.models.loading", "fedtune.models.lora",
                   "fedtune.training.local"]


def tenant_views_json(job: JobConfig) -> str:
    """What a worker receives of the job: every tenant's view, built by the provider."""
    from fedtune.engines import layout

    return json.dumps(
        {t.name: layout.view_for(job, t.name).model_dump(mode="json") for t in job.tenants}
    )


def _warm_up(tenants: TenantEnvs) -> None:
    """Load the tenant-readable base the tenants share (its env goes with this frame)."""
    first = tenants[tenants.names[0]]
    if first.algorithm.tenants_load_base:
        first.ctx.base_model()


def _worker_main(
    conn: Connection,
    views_json: str,
    threads: int,
    fault: str | None,
    device: str = "cpu",
    per_device: int = 1,
) -> None:
    """A worker's loop: build the tenants' envs once, then run tasks until told to stop."""
    die_with_parent()  # a SIGKILLed engine runs no cleanup: the kernel ends us
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the engine handles Ctrl-C and stops us
    _pin_device(device, per_device)
    from fedtune.core.library_logs import quiet_libraries

    quiet_libraries()
    import torch

    torch.set_num_threads(threads)
    from fedtune.config.tenant_view import TenantJob
    from fedtune.engines import steps

    # The tenants' views, built by the provider: a worker never holds the job itself.
    views = {name: TenantJob.model_validate(v) for name, v in json.loads(views_json).items()}
    tenants = steps.TenantEnvs(views)
    try:  # warm the shared tenant-readable base before the first task
        _warm_up(tenants)
    except Exception:  # noqa: BLE001 - the CLI starts workers before its checks: they report
        log.debug("worker warm-up failed; the first task meets the error again", exc_info=True)
    finally:
        tenants.release()  # the warm-up keeps the shared base, nothing of its tenant
    while True:
        message = conn.recv_bytes()
        if not message:
            return
        task = Task(**json.loads(message))
        if fault == f"{task.kind}:{task.round_index}:{task.tenant}":
            os.kill(os.getpid(), signal.SIGKILL)
        outcome = run_task(tenants, task)
        reply = {"result": outcome.result, "failure": outcome.failure,
                 "memory": {"device": device, **peak_memory(device)}}
        conn.send_bytes(json.dumps(reply, default=str).encode("utf-8"))


def run_task(tenants: Any, task: Task) -> Outcome:
    """Run one tenant step against its env; a tenant's FedtuneError is its outcome.

    Only the redacted failure reaches the provider's summary and MLflow; the details go to
    the tenant's own store.
    """
    from fedtune.engines import steps
    from fedtune.engines.tenant.tasks import failure_tag, run_tenant_task

    env = tenants[task.tenant]
    try:
        if task.part:
            return Outcome(task, steps.client_step_part(env, task.round_index, task.start, task.stop))
        return Outcome(task, run_tenant_task(env, task.kind, task.round_index))
    except FedtuneError as exc:
        where = steps.keep_failure_details(env, failure_tag(task.kind, task.round_index), exc)
        failure = exc.redacted().render()
        log.error("%s step of tenant %s failed: %s; details: %s", task.kind, task.tenant,
                  failure, where)
        return Outcome(task, None, f"{task.kind} step failed: {failure}")
    finally:
        del env  # so that release() leaves no reference to this tenant's env here
        tenants.release()  # the next task, of whichever tenant, finds nothing of this one


class InProcessRunner:
    """The same interface as :class:`WorkerPool`, running tasks one after another here."""

    def __init__(self, tenants: Any, threads: int | None = None) -> None:
        self.tenants = tenants  # steps.TenantEnvs
        self.threads = threads  # torch threads of each step (None: leave torch's setting)

    def __enter__(self) -> InProcessRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def run(
        self, tasks: Sequence[Task], on_done: Callable[[Outcome], None] | None = None
    ) -> dict[str, Outcome]:
        """Run ``tasks`` in order in this process."""
        outcomes: dict[str, Outcome] = {}
        for task in tasks:
            with step_threads(self.threads):
                outcomes[task.tenant] = run_task(self.tenants, task)
            if on_done:
                on_done(outcomes[task.tenant])
        return outcomes


_prestarted: dict[tuple[str, int], tuple[WorkerPool, threading.Thread]] = {}


def prestart(job: JobConfig, workers: int | str) -> None:
    """Spawn ``job``'s worker pool now, so that the workers' imports and warm-up overlap this
    process's own (the CLI calls this before it imports the engine); :func:`tenant_runner`
    then hands it out. Does nothing for one worker or a bad count (the run reports that)."""
    try:
        devices = pool_plan(job, workers)
    except ConfigError:
        return
    size = len(devices)
    if size > 1:
        pool = WorkerPool(job, size, devices)
        # In a thread: starting waits until the fork server has imported the libraries.
        starting = threading.Thread(target=pool.start, name="fedtune-worker-start", daemon=True)
        starting.start()
        _prestarted[(pool.job_json, size)] = (pool, starting)


def tenant_runner(job: JobConfig, tenants: Any, workers: int | str) -> InProcessRunner | WorkerPool:
    """In this process for one worker, else a pool of ``workers`` spawned processes (the
    one :func:`prestart` started for this job, if any). Checks ``engine.worker_devices``
    even for one worker, though that one runs in this process, unpinned."""
    devices = pool_plan(job, workers)
    size = len(devices)
    if size == 1:
        return InProcessRunner(tenants, job.engine.step_threads)
    pool = WorkerPool(job, size, devices)
    prestarted = _prestarted.pop((pool.job_json, size), None)
    if prestarted is None:
        return pool
    prestarted[1].join()
    return prestarted[0]


@contextmanager
def step_threads(threads: int | None) -> Iterator[None]:
    """Run the block with ``threads`` torch threads (None: unchanged), then restore them."""
    if threads is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _Worker:
    def __init__(
        self, context: Any, job_json: str, threads: int, device: str, per_device: int
    ) -> None:
        self.conn, child = context.Pipe()
        # The fault spec travels as an argument: a forked worker has the fork server's
        # environment, not this process's.
        fault = os.environ.get(FAULT_ENV)
        self.process = context.Process(
            target=_worker_main,
            args=(child, job_json, threads, fault, device, per_device),
            daemon=True,
        )
        self.process.start()
        child.close()
        self.task: Task | None = None


def share_steps(tasks: Sequence[Task], workers: int, steps: int | None) -> list[list[Task]]:
    """One queue of tasks per worker, sharing a round's client steps evenly.

    Without ``steps`` (the fixed local steps of a splittable client step) every task goes
    to the first queue, which idle workers drain in order. With it, McNaughton's wrap-around
    rule (McNaughton 1959, "Scheduling with deadlines and loss functions") fills each queue
    with ``ceil(total / workers)`` steps: a tenant that does not fit is cut in two, its first
    steps opening the next queue and its last steps closing this one. Three equal tenants on
    two cores then take 1.5 tenants' time instead of 2. No part runs before the part it
    continues (a queue's quota is at least one whole step), so the steps of a cut tenant run
    in order, one part after the other, and the results stay bitwise equal.
    """
    queues: list[list[Task]] = [[] for _ in range(workers)]
    if steps is None or workers < 2 or any(t.kind != "client" or t.part for t in tasks):
        queues[0] = list(tasks)
        return queues
    quota = max(steps, -(-steps * len(tasks) // workers))
    worker, free = 0, quota
    for task in tasks:
        if steps <= free:
            queues[worker].append(task)
            free -= steps
        else:
            head = steps - free
            queues[worker].append(replace(task, start=head, stop=None))
            worker += 1
            queues[worker].append(replace(task, start=0, stop=head))
            free = quota - head
        if free == 0:
            worker, free = worker + 1, quota
    return queues


def _split_steps(job: JobConfig) -> int | None:
    """The local steps of the job's client step where the pool may cut it, else None."""
    if job.secure_aggregation.enabled or job.training.local_steps is None:
        return None
    if any(t.dp_sgd is not None for t in job.tenants):  # DP-SGD's batches and noise run whole
        return None
    if not type(job.algorithm).capabilities.splittable_client_step:
        return None
    return job.training.local_steps


class WorkerPool:
    """``size`` worker processes for one job; use as a context manager."""

    def __init__(self, job: JobConfig, size: int, devices: Sequence[str] | None = None) -> None:
        self.job = job
        self.size = size
        self.devices = list(devices or ["cpu"] * size)  # worker i's device (device_plan)
        self.peaks: dict[int, dict[str, float]] = {}  # worker i's peak memory so far
        # Each worker's share of the CPUs this process may use, so workers do not oversubscribe.
        self.threads = threads_for(job.engine.step_threads, size)
        self._context = fork_server.context(PRELOAD)
        self.job_json = json.dumps(job.model_dump(mode="json"))  # names the pool (prestart)
        self.views_json = tenant_views_json(job)
        self._workers: list[_Worker] = []

    def start(self) -> None:
        """Spawn the workers (once; entering the pool starts it if this was not called)."""
        if not self._workers:
            self._workers = [self._spawn(i) for i in range(self.size)]
            log.info("started %d worker(s), %d torch thread(s) each", self.size, self.threads)

    def __enter__(self) -> WorkerPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(terminate=exc[0] is not None)

    def _spawn(self, index: int) -> _Worker:
        return _Worker(self._context, self.views_json, self.threads, self.devices[index],
                       self.job.engine.workers_per_device)

    def _note_memory(self, index: int, memory: dict[str, Any] | None) -> None:
        """Keep worker ``index``'s peak memory (a replaced worker's peak stays if larger)."""
        if not memory:
            return
        peak = self.peaks.setdefault(index, {})
        for key, value in memory.items():
            if key.startswith("peak_"):
                peak[key] = max(float(value), peak.get(key, 0.0))

    def report(self) -> list[dict[str, Any]]:
        """Every worker's device and peak memory (MiB) over the run, for the run summary."""
        return [
            {"worker": i, "device": device, **self.peaks.get(i, {})}
            for i, device in enumerate(self.devices)
        ]

    def run(
        self, tasks: Sequence[Task], on_done: Callable[[Outcome], None] | None = None
    ) -> dict[str, Outcome]:
        """Run ``tasks`` on the workers; return each tenant's outcome (order of completion
        does not matter: the caller aggregates in sorted tenant order).

        Client steps may be cut in parts (:func:`share_steps`); a part that continues
        another waits for it, and a tenant whose part fails loses its remaining parts.
        """
        queues = share_steps(tasks, self.size, _split_steps(self.job) if len(tasks) > 1 else None)
        suspended: set[str] = set()  # tenants whose first part stopped where the next begins
        outcomes: dict[str, Outcome] = {}

        def ready(task: Task) -> bool:
            return not task.start or task.tenant in suspended

        def finish(outcome: Outcome) -> None:
            outcomes[outcome.task.tenant] = outcome
            for queue in queues:  # a finished or failed tenant has no parts left to run
                queue[:] = [t for t in queue if t.tenant != outcome.task.tenant]
            if on_done:
                on_done(outcome)

        while any(queues) or any(w.task for w in self._workers):
            for index, worker in enumerate(self._workers):
                if worker.task is None:
                    worker.task = self._next(queues, index, ready)
                    if worker.task is not None:
                        worker.conn.send_bytes(json.dumps(worker.task.__dict__).encode("utf-8"))
            busy = [w for w in self._workers if w.task is not None]
            if not busy:
                raise RuntimeError(f"worker pool stalled with parts {queues} waiting")
            ready_conns = wait([w.conn for w in busy] + [w.process.sentinel for w in busy])
            for worker in busy:
                task = worker.task
                assert task is not None
                if worker.conn in ready_conns and worker.conn.poll():
                    try:
                        reply = json.loads(worker.conn.recv_bytes())
                    except (EOFError, OSError):
                        reply = None
                    if reply is not None:
                        worker.task = None
                        self._note_memory(self._workers.index(worker), reply.get("memory"))
                        result = reply.get("result")
                        if task.part and result is not None and "suspended" in result:
                            suspended.add(task.tenant)
                        else:
                            finish(Outcome(task, result, reply.get("failure")))
                        continue
                if worker.process.sentinel in ready_conns or not worker.process.is_alive():
                    worker.process.join()
                    reason = (
                        f"{task.kind} step failed: its worker process died (exit code "
                        f"{worker.process.exitcode}) while running it; a new worker took its place"
                    )
                    log.error("tenant %s: %s", task.tenant, reason)
                    index = self._workers.index(worker)
                    self._workers[index] = self._spawn(index)
                    finish(Outcome(task, None, reason))
        return outcomes

    @staticmethod
    def _next(
        queues: list[list[Task]], index: int, ready: Callable[[Task], bool]
    ) -> Task | None:
        """The first ready task of worker ``index``'s queue, else the first ready one of any
        other queue (a worker that runs ahead takes over work planned for another)."""
        for queue in [queues[index], *queues[:index], *queues[index + 1 :]]:
            for position, task in enumerate(queue):
                if ready(task):
                    return queue.pop(position)
        return None

    def close(self, terminate: bool = False) -> None:
        """Stop every worker: ask politely, or terminate them (Ctrl-C, an error)."""
        for worker in self._workers:
            if terminate:
                worker.process.terminate()
                continue
            try:
                worker.conn.send_bytes(b"")
            except (BrokenPipeError, OSError):
                pass
        for worker in self._workers:
            worker.process.join(timeout=30)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.conn.close()
        self._workers = []
