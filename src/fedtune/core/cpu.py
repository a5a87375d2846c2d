"""How many torch threads a step may use: the CPUs this process may run on, not the host's.

torch takes one intra-op thread per core it sees. In a Kubernetes pod with a CPU limit that
is the node's cores, not the pod's quota, and a step with 64 threads on a 2-CPU quota spends
its time throttled and waiting at OpenMP barriers. The CPUs a process may use are the fewer
of its affinity mask (``os.sched_getaffinity``: ``taskset``, cpusets) and its cgroup CPU
quota (``cpu.max`` in cgroup v2, ``cpu.cfs_quota_us / cpu.cfs_period_us`` in v1), over the
process's own cgroup and every cgroup above it.

Reading choices: a fractional quota rounds *down* (at least one), as Uber's automaxprocs
does for Go, because a thread beyond the quota is throttled rather than run. joblib/loky's
``cpu_count`` reads the same files but only at fixed paths and rounds up, so it cannot be
pointed at a test's folder and oversubscribes a 1.5-CPU quota.

Precedence of a step's threads: an explicit setting (``--threads``, ``engine.step_threads``,
``$FEDTUNE_THREADS``, which the CLI and launcher pass on to subprocesses and pods), then
``$OMP_NUM_THREADS`` as the user set it, then the usable CPUs (shared among workers).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
THREADS_ENV = "FEDTUNE_THREADS"
"""Torch threads of every step of this process and its children (what ``--threads`` sets)."""


def _own_cgroups(proc_cgroup: Path) -> dict[str, str]:
    """Controller (``""`` for cgroup v2) -> this process's cgroup path, from /proc/self/cgroup."""
    try:
        lines = proc_cgroup.read_text("utf-8").splitlines()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(","):
                out[controller] = parts[2]
    return out


def _ancestors(root: Path, own: str | None) -> list[Path]:
    """``root`` joined with ``own`` and every cgroup above it, up to ``root`` itself.

    In a container with its own cgroup namespace the process's cgroup *is* the mount's root
    (``/``); without one it is a path under it, and a limit may sit at any level.
    """
    folders = [root]
    if own and own.strip("/"):
        parts = Path(own.strip("/")).parts
        folders += [root.joinpath(*parts[:n]) for n in range(1, len(parts) + 1)]
    return [f for f in folders if f.is_dir()]


def _quota_v2(folder: Path) -> float | None:
    """CPUs allowed by ``folder/cpu.max`` (``"max 100000"``: no limit)."""
    try:
        quota, _, period = (folder / "cpu.max").read_text("utf-8").strip().partition(" ")
    except OSError:
        return None
    if quota == "max":
        return None
    try:
        return int(quota) / int(period or 100000)
    except (ValueError, ZeroDivisionError):
        return None


def _quota_v1(folder: Path) -> float | None:
    """CPUs allowed by cgroup v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1: none)."""
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text("utf-8"))
        period = int((folder / "cpu.cfs_period_us").read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def cgroup_cpu_limit(root: Path | None = None, proc_cgroup: Path | None = None) -> float | None:
    """The CPUs this process's cgroups allow (the smallest quota on its path), None if none.

    ``root`` is where the cgroup file system is mounted: the v2 hierarchy itself, or the
    v1 mount holding one folder per controller (``cpu``, ``cpu,cpuacct``); ``proc_cgroup``
    lists the process's cgroups. Both default to this process's (:data:`CGROUP_ROOT`,
    :data:`PROC_CGROUP`).
    """
    root = root or CGROUP_ROOT
    own = _own_cgroups(proc_cgroup or PROC_CGROUP)
    limits = [q for f in _ancestors(root, own.get("")) if (q := _quota_v2(f)) is not None]
    for controller in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        v1 = root / controller
        if v1.is_dir():
            limits += [q for f in _ancestors(v1, own.get("cpu")) if (q := _quota_v1(f)) is not None]
            break
    return min(limits) if limits else None


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (all the host's where there is no mask)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # pragma: no cover - macOS, Windows


def usable_cpus(root: Path | None = None, proc_cgroup: Path | None = None) -> int:
    """Whole CPUs this process may use: its affinity mask capped by its cgroup quota."""
    cpus = affinity_cpus()
    limit = cgroup_cpu_limit(root, proc_cgroup)
    if limit is not None:
        cpus = min(cpus, math.floor(limit))
    return max(1, cpus)


def _env_threads(name: str) -> int | None:
    """A positive whole number from ``$name``, else None (unset, empty or not a number)."""
    try:
        value = int(os.environ.get(name, ""))
    except ValueError:
        return None
    return value if value >= 1 else None


def threads_for(setting: int | None = None, workers: int = 1) -> int:
    """Torch threads for each of ``workers`` processes sharing this process's CPUs.

    ``setting`` (``--threads``, ``engine.step_threads``) wins, then ``$FEDTUNE_THREADS``,
    then ``$OMP_NUM_THREADS``, then the usable CPUs divided among the workers.
    """
    chosen = setting or _env_threads(THREADS_ENV) or _env_threads("OMP_NUM_THREADS")
    return chosen or max(1, usable_cpus() // max(1, workers))


def apply_threads(threads: int) -> None:
    """Use ``threads`` torch threads in this process from now on (imports torch)."""
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def preset_threads(threads: int) -> None:
    """:func:`apply_threads` without importing torch: a pod's step that has not loaded it
    sets ``$OMP_NUM_THREADS``, which torch reads when it loads, at most one per CPU (and
    which the step's own subprocesses, e.g. its ranks, take as the threads they share)."""
    if "torch" in sys.modules:
        apply_threads(threads)
    else:
        os.environ["OMP_NUM_THREADS"] = str(threads)


def prefer_passive_wait() -> None:
    """Let torch's idle OpenMP threads sleep rather than spin (unless the user chose).

    libgomp's threads spin for a while at every barrier before they sleep. On CPUs shared
    with other processes (a loaded laptop, a node's other pods) a spinning thread takes
    the core its partner needs to reach the barrier: measured on a 2-core machine at load
    6-14, the quickstart's rounds took 25-80 s with torch's 2 threads and 5-6.5 s with
    ``OMP_WAIT_POLICY=PASSIVE`` (one thread: 5-8 s). libgomp reads the variable once, when
    torch is imported, so ``fedtune`` sets it on import.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
