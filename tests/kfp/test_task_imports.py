"""What a KFP task imports: every task is a fresh Python process, so its imports are its start-up.

Each step's module imports no torch, transformers, PEFT, DeepSpeed or MLflow; run on a real
job, the provider's tensor steps (configure-round, aggregate) use torch but neither
transformers nor PEFT, and close-rounds, which only reads records, not even torch. The
algorithm registry imports the one algorithm looked up, and lists names without importing any.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

from fedtune.algorithms import registry
from fedtune.algorithms.registry import BUILTIN
from fedtune.config.packages import specs
from fedtune.core.catalog import algorithm_catalog
from fedtune.engines import layout
from fedtune.entrypoints import client_step, common, server_init
from fedtune.pipelines.components import COMPONENTS
from fedtune.pipelines.run_form import FAMILIES, JOB_SCOPE, RunForm
from tests.integration.crash_helpers import fedtune_env
from tests.kfp.conftest import two_tenant_job

HEAVY = ("torch", "transformers", "peft", "deepspeed", "mlflow")
#: What the config layer reads of every algorithm package: the package and its config section.
PACKAGE_CONFIGS = tuple(
    m for p in sorted(specs()) for m in (f"fedtune.algorithms.{p}", f"fedtune.algorithms.{p}.config")
)
#: The modules that register the FedIT family's algorithms.
FEDIT_FAMILY = tuple(sorted({BUILTIN[n] for n in FAMILIES["fedit"]}))


def _loaded_after(code: str) -> list[str]:
    """The heavy libraries in ``sys.modules`` after a fresh interpreter runs ``code``."""
    probe = f"{code}\nimport sys\nprint('LOADED=' + ','.join(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", probe], env=fedtune_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("LOADED="))
    return [m for m in line.removeprefix("LOADED=").split(",") if m]


def test_no_step_module_imports_a_heavy_library() -> None:
    """All step modules in one process: what none of them imports, no one of them does."""
    imports = "\n".join(f"import fedtune.entrypoints.{step}" for step in sorted(COMPONENTS))
    assert _loaded_after(imports) == []


def test_provider_steps_run_with_only_what_they_use(tmp_path: Path) -> None:
    """One round of the 2-tenant SCAFFOLD job, the provider's light steps each in a fresh
    process as kfp.local runs them; the tenants' steps (which need PEFT) run here."""
    job = two_tenant_job(
        tmp_path / "w",
        algorithm={"name": "scaffold"},
        training={"local_steps": 1, "batch_size": 4, "lr": 0.01, "optimizer": "sgd"},
    )
    art = tmp_path / "artifacts"
    form = RunForm(job_config=json.dumps(job.model_dump(mode="json")), resume_run_id=JOB_SCOPE)
    assert server_init.component(form, "fedit", str(art / "job"), str(art / "init")) == [1]

    def step(module: str, *args: object) -> list[str]:
        return _loaded_after(f"from fedtune.entrypoints import {module}\n{module}.component(*{args!r})")

    assert step("configure_round", str(art / "job"), 1, str(art / "b1")) == ["torch"]
    assert common.read_marker(art / "b1")["sampled"] == ["tenant-a", "tenant-b"]
    for tenant in ("tenant-a", "tenant-b"):
        client_step.component(str(art / "job"), str(art / "b1"), tenant, "run", str(art / tenant))
    updates = [str(art / "tenant-a"), str(art / "tenant-b")]
    assert step("aggregate", str(art / "job"), str(art / "b1"), updates, str(art / "s1")) == ["torch"]
    record = layout.JobStores(job).provider().get_json(layout.summary_key(1))
    assert record["accepted"] == ["tenant-a", "tenant-b"]
    table = art / "rounds.md"
    assert step("close_rounds", str(art / "job"), str(art / "init"), str(art / "s2"), str(table)) == []
    assert table.read_text("utf-8").splitlines()[2].startswith("| 1 | tenant-a, tenant-b |")


def test_listing_and_validating_algorithm_names_imports_no_algorithm() -> None:
    code = (
        "from fedtune.algorithms.registry import algorithm_names, get_algorithm\n"
        "from fedtune.core.errors import RegistryError\n"
        "import sys\n"
        "assert 'fedavg' in algorithm_names() and 'fedbiot' in algorithm_names()\n"
        "try:\n    get_algorithm('fedavgg')\nexcept RegistryError as exc:\n"
        "    assert 'fedavgg' in str(exc) and 'fedavg' in str(exc), exc\n"
        "assert not [m for m in sys.modules if m.startswith('fedtune.algorithms.') "
        f"and m not in {PACKAGE_CONFIGS!r} + ('fedtune.algorithms.registry',)]"
    )
    assert _loaded_after(code) == []


def test_looking_up_a_fedit_algorithm_imports_no_other_family_nor_peft() -> None:
    names = list(FAMILIES["fedit"])
    code = (
        "from fedtune.algorithms.registry import get_algorithm\nimport sys\n"
        f"assert all(get_algorithm(n).__module__ == {BUILTIN!r}[n] for n in {names!r})\n"
        "others = [m for m in sys.modules if m.startswith('fedtune.algorithms.') "
        f"and m not in {FEDIT_FAMILY + PACKAGE_CONFIGS!r} + "
        "('fedtune.algorithms.base', 'fedtune.algorithms.registry')]\n"
        "assert not others, others"
    )
    assert _loaded_after(code) == ["torch"]


def test_the_registry_table_names_every_registered_algorithm_and_its_module() -> None:
    """The table against the catalog read from the source (``@register`` classes and their
    config sections), and against what importing every module registers."""
    assert sorted(BUILTIN) == sorted(algorithm_catalog())
    for module in set(BUILTIN.values()):
        importlib.import_module(module)
    found = {name: cls.__module__ for name, cls in registry._ALGORITHMS.items()}
    assert found == BUILTIN
