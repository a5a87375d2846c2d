"""The fork server imports what the processes forked from it need, so they start warm."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from fedtune.config import JobConfig
from fedtune.engines import fork_server, steps
from fedtune.engines.workers import tenant_views_json

# What a worker does with its first task, in a fresh interpreter that imported only what the
# fork server imports: which modules did the task import on top of those?
_FIRST_TASK = """
import importlib, json, sys
from fedtune.engines import workers
for module in workers.PRELOAD:
    importlib.import_module(module)
from fedtune.config.tenant_view import TenantJob
from fedtune.engines import steps
views = json.loads(open(sys.argv[1]).read())
before = set(sys.modules)
tenants = steps.TenantEnvs({n: TenantJob.model_validate(v) for n, v in views.items()})
outcome = workers.run_task(tenants, workers.Task("client", 1, "tenant-a"))
assert outcome.failure is None, outcome.failure
print(json.dumps(sorted(set(sys.modules) - before)))
"""


@pytest.mark.slow  # a fresh interpreter imports torch, transformers and PEFT (seconds)
def test_a_workers_client_step_imports_no_model_library_the_fork_server_did_not(
    make_job: Callable[..., JobConfig], tmp_path: Path
) -> None:
    # Each worker importing transformers and PEFT itself cost seconds of every core at once.
    job = make_job()
    provider = steps.ProviderEnv.create(job)
    steps.init_step(provider)
    steps.configure_step(provider, 1)
    views = tmp_path / "views.json"
    views.write_text(tenant_views_json(job), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-c", _FIRST_TASK, str(views)],
        capture_output=True, text=True, check=False, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    imported = set(json.loads(done.stdout.strip().splitlines()[-1]))
    # Submodules of a model family load at its first use; the libraries themselves must not.
    assert not imported & {"torch", "transformers", "peft", "safetensors", "tokenizers"}, imported
    assert "fedtune.training.local" not in imported


def test_the_fork_server_imports_its_guard_first_and_the_engines_fedtune_main_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Main:
        class __spec__:  # noqa: N801 - the attribute multiprocessing reads
            name = "fedtune.cli.main"

    monkeypatch.setitem(sys.modules, "__main__", Main)
    assert fork_server.preloads(["torch", "torch"]) == [
        fork_server.GUARD, "torch", "fedtune.cli.main"
    ]
    # Another program's main module is not the fork server's to import.
    Main.__spec__.name = "someone.elses.tool"
    assert fork_server.preloads(["torch"]) == [fork_server.GUARD, "torch"]
