"""Threads from the CPUs a process may use: cgroup quotas (v1, v2, nested) and affinity."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedtune.core import cpu

SRC = str(Path(cpu.__file__).resolve().parents[2])


def _cgroup_v2(root: Path, quotas: dict[str, str], own: str = "/") -> tuple[Path, Path]:
    """A fake cgroup v2 mount: ``cpu.max`` per folder, and the process's /proc/self/cgroup."""
    for folder, quota in quotas.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "cpu.max").write_text(quota + "\n")
    proc = root.parent / "proc-cgroup"
    proc.write_text(f"0::{own}\n")
    return root, proc


def _no_thread_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cpu.THREADS_ENV, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


@pytest.mark.parametrize(
    ("quotas", "own", "expected"),
    [
        ({".": "max 100000"}, "/", None),  # no limit
        ({".": "200000 100000"}, "/", 2.0),  # a container's own cgroup namespace
        ({".": "150000 100000"}, "/", 1.5),
        # Without a cgroup namespace: the process's cgroup and the ones above it count.
        ({"kubepods/pod1": "50000 100000", "kubepods": "400000 100000"}, "/kubepods/pod1", 0.5),
        ({"kubepods/pod1": "max 100000", "kubepods": "300000 100000"}, "/kubepods/pod1", 3.0),
        # A path that is not under this mount (the container sees its cgroup as the root).
        ({".": "100000 100000"}, "/elsewhere/x", 1.0),
    ],
)
def test_cgroup_v2_quota(
    tmp_path: Path, quotas: dict[str, str], own: str, expected: float | None
) -> None:
    root, proc = _cgroup_v2(tmp_path / "cg", quotas, own)
    assert cpu.cgroup_cpu_limit(root, proc) == expected


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    folder = tmp_path / "cg" / "cpu,cpuacct"
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text("250000\n")
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "proc-cgroup"
    proc.write_text("3:cpu,cpuacct:/\n0::/\n")
    assert cpu.cgroup_cpu_limit(tmp_path / "cg", proc) == 2.5
    (folder / "cpu.cfs_quota_us").write_text("-1\n")  # v1's "no limit"
    assert cpu.cgroup_cpu_limit(tmp_path / "cg", proc) is None


@pytest.mark.parametrize(("quota", "expected"), [("50000", 1), ("100000", 1), ("190000", 1)])
def test_a_quota_below_the_affinity_caps_the_threads_rounding_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quota: str, expected: int
) -> None:
    _no_thread_env(monkeypatch)
    root, proc = _cgroup_v2(tmp_path / "cg", {".": f"{quota} 100000"})
    monkeypatch.setattr(cpu, "CGROUP_ROOT", root)
    monkeypatch.setattr(cpu, "PROC_CGROUP", proc)
    monkeypatch.setattr(cpu, "affinity_cpus", lambda: 64)  # a big node, a small pod
    assert cpu.usable_cpus() == expected
    assert cpu.threads_for() == expected


def test_workers_share_the_quota(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fedtune.engines.workers import resolve_workers

    _no_thread_env(monkeypatch)
    root, proc = _cgroup_v2(tmp_path / "cg", {".": "400000 100000"})
    monkeypatch.setattr(cpu, "CGROUP_ROOT", root)
    monkeypatch.setattr(cpu, "PROC_CGROUP", proc)
    monkeypatch.setattr(cpu, "affinity_cpus", lambda: 64)
    assert [cpu.threads_for(workers=n) for n in (1, 2, 3, 8)] == [4, 2, 1, 1]
    assert resolve_workers("auto") <= 4  # one worker per usable CPU, not per host core


def test_an_explicit_setting_wins_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_thread_env(monkeypatch)
    monkeypatch.setattr(cpu, "usable_cpus", lambda *a: 8)
    assert cpu.threads_for(workers=2) == 4
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cpu.threads_for(workers=2) == 3
    monkeypatch.setenv(cpu.THREADS_ENV, "5")
    assert cpu.threads_for(workers=2) == 5
    assert cpu.threads_for(6, workers=2) == 6
    monkeypatch.setenv(cpu.THREADS_ENV, "lots")  # not a number: ignored, not fatal
    assert cpu.threads_for() == 3


def _child(code: str, env: dict[str, str] | None = None) -> str:
    base = {k: v for k, v in os.environ.items()
            if k not in ("OMP_NUM_THREADS", cpu.THREADS_ENV, "OMP_WAIT_POLICY")}
    result = subprocess.run(
        [sys.executable, "-c", code], env={**base, "PYTHONPATH": SRC, **(env or {})},
        capture_output=True, text=True, timeout=120, check=True,
    )
    return result.stdout.strip()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no affinity masks here")
def test_the_affinity_mask_sets_the_threads() -> None:
    code = (
        "import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
        "from fedtune.core.cpu import threads_for; print(threads_for())"
    )
    assert _child(code) == "1"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell 1 from all")
def test_a_pod_step_takes_its_quota_not_the_nodes_cores(tmp_path: Path) -> None:
    """What a KFP pod's step does first (``setup_logging``) gives torch the quota's threads,
    though torch alone would take every CPU of the affinity mask."""
    root, proc = _cgroup_v2(tmp_path / "cg", {".": "100000 100000"})
    code = (
        "from pathlib import Path; import fedtune.core.cpu as cpu; "
        f"cpu.CGROUP_ROOT = Path({str(root)!r}); cpu.PROC_CGROUP = Path({str(proc)!r}); "
        "from fedtune.entrypoints.common import setup_logging; setup_logging(); "
        "import torch, json; print(json.dumps([torch.get_num_threads()]))"
    )
    assert json.loads(_child(code)) == [1]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell 1 from all")
def test_a_jobs_step_threads_reach_a_pod_step() -> None:
    """engine.step_threads wins over the pod's CPUs (read before torch loads, as pods do)."""
    code = (
        "from fedtune.config import parse_job; from fedtune.entrypoints import common; "
        "from tests.integration.conftest import tiny_job_dict; common.setup_logging(); "
        "common.use_job_threads(parse_job(tiny_job_dict('/tmp/x', engine={'step_threads': 1}))); "
        "import torch; print(torch.get_num_threads())"
    )
    root = str(Path(SRC).parent)
    assert _child(code, {"PYTHONPATH": f"{SRC}{os.pathsep}{root}"}) == "1"


def test_fedtune_lets_idle_openmp_threads_sleep_unless_told_otherwise() -> None:
    code = "import os, fedtune; print(os.environ['OMP_WAIT_POLICY'])"
    assert _child(code) == "PASSIVE"
    assert _child(code, {"OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE"


def test_a_worker_pool_gives_each_worker_its_share_of_the_quota(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedtune.config import parse_job
    from fedtune.engines.workers import WorkerPool
    from tests.integration.conftest import tiny_job_dict

    _no_thread_env(monkeypatch)
    root, proc = _cgroup_v2(tmp_path / "cg", {".": "400000 100000"})
    monkeypatch.setattr(cpu, "CGROUP_ROOT", root)
    monkeypatch.setattr(cpu, "PROC_CGROUP", proc)
    monkeypatch.setattr(cpu, "affinity_cpus", lambda: 64)
    job = parse_job(tiny_job_dict(tmp_path / "work"))
    assert WorkerPool(job, 2).threads == 2  # created, not started
    pinned = parse_job(tiny_job_dict(tmp_path / "work", engine={"step_threads": 3}))
    assert WorkerPool(pinned, 2).threads == 3


def test_a_launched_tenant_pod_gets_the_jobs_step_threads() -> None:
    from fedtune.config import parse_job
    from tests.kfp.conftest import cluster_job_dict
    from tests.kfp.test_launcher_manifest import env_of, manifest

    assert cpu.THREADS_ENV not in env_of(manifest())  # the pod's CPU limit decides
    raw = cluster_job_dict()
    raw["engine"] = {"step_threads": 2}
    assert env_of(manifest(job=parse_job(raw)))[cpu.THREADS_ENV] == "2"
