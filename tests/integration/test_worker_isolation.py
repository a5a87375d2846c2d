"""A worker (and the in-process engine) keeps nothing of one tenant for the next tenant's step.

For every algorithm: the provider prepares round 1, then a fresh process runs tenant A's and
tenant B's client steps as a worker does (tests/helpers/isolation.py); when B's step starts,
no object reachable there may hold one of A's update or kept-state tensors (compared by
value) or A's data.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fedtune.algorithms.registry import algorithm_names
from fedtune.config import JobConfig
from fedtune.config.capabilities import capabilities_of
from fedtune.engines import steps
from tests.integration.test_algorithm_table import JOB_OVERRIDES, TABLE

ROOT = Path(__file__).resolve().parents[2]
def _probe(mode: str, job: JobConfig) -> dict[str, Any]:
    provider = steps.ProviderEnv.create(job)
    steps.init_step(provider)
    steps.configure_step(provider, 1)
    a, b = sorted(t.name for t in job.tenants)[:2]
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, str(ROOT / "src"), str(ROOT)]),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.helpers.isolation", mode,
         json.dumps(job.model_dump(mode="json")), a, b],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("ISOLATION ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    return dict(json.loads(lines[-1].removeprefix("ISOLATION ")))


def _job(make_job: Callable[..., JobConfig], name: str) -> JobConfig:
    job = make_job(rounds=1, algorithm=TABLE[name], **JOB_OVERRIDES.get(name, {}))
    if len(job.tenants) < 2:
        pytest.skip(f"{name} runs a single client: there is no other tenant to keep apart")
    return job


FAST = {"fedavg", "fedmkt"}


@pytest.mark.parametrize("mode", ["worker", "in-process"])
@pytest.mark.parametrize(
    "name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in algorithm_names()]
)
def test_tenant_b_step_finds_nothing_of_tenant_a(
    make_job: Callable[..., JobConfig], name: str, mode: str
) -> None:
    result = _probe(mode, _job(make_job, name))
    assert result["failures"] == [None, None]  # both steps ran
    assert result["found"] == [], result["found"]


def test_the_probe_finds_a_tensor_held_across_tenants(make_job: Callable[..., JobConfig]) -> None:
    """The walk itself finds A's tensors where something keeps them: a module global here."""
    job = _job(make_job, "fedavg")
    provider = steps.ProviderEnv.create(job)
    steps.init_step(provider)
    steps.configure_step(provider, 1)
    from fedtune.engines.workers import InProcessRunner, Task
    from tests.helpers import isolation

    runner = InProcessRunner(steps.TenantEnvs(job), threads=1)
    runner.run([Task("client", 1, "tenant-a")])
    refs = isolation.references(job, "tenant-a")
    assert refs
    kept = [r.clone() for r in refs]  # what a leaking cache would hold
    assert isolation.holders(refs, "tenant-a")
    del kept
    assert isolation.holders(refs, "tenant-a") == []


def test_a_tenants_own_model_is_built_once_and_never_served_to_another_tenant(
    make_job: Callable[..., JobConfig],
) -> None:
    """FedMKT's small model is its tenant's alone: kept (its adapter reset) for that tenant's
    next step in this process, dropped as soon as the process serves another tenant."""
    import torch

    from fedtune.models.lora import adapter_state, set_adapter_state

    owned = [n for n in algorithm_names() if capabilities_of(n).tenant_models]
    assert owned  # the rule below is about these algorithms
    job = make_job(rounds=1, algorithm=TABLE[owned[0]], **JOB_OVERRIDES.get(owned[0], {}))
    tenants = steps.TenantEnvs(job)
    a, b = tenants.names[:2]
    model_a = tenants[a].ctx.peft_model()
    initial = {k: v.clone() for k, v in adapter_state(model_a).items()}
    set_adapter_state(model_a, {k: v + 1.0 for k, v in initial.items()})  # A's step trained it
    tenants.release()

    assert tenants[a].ctx.peft_model() is model_a  # A's next step: the same model, not rebuilt
    assert all(torch.equal(v, initial[k]) for k, v in adapter_state(model_a).items())
    tenants.release()
    model_b = tenants[b].ctx.peft_model()
    assert model_b is not model_a
    held = [entry.get("owner") for entry in tenants._shared.cache.values()]
    assert a not in held and b in held  # B's step finds no model of A's
    tenants.release()
    assert tenants[a].ctx.peft_model() is not model_a  # after B, A's model is built anew
