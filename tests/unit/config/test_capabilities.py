"""Each algorithm's capabilities, declared once, decide what every part of fedtune accepts.

Generated from the registry: for every algorithm, a job asking for secure aggregation,
a tenant's DP-SGD, central DP or the memorization audit is accepted exactly where the
algorithm declares it, and refused at validation with a clear error elsewhere; its pipeline
family has a committed pipeline; looking it up imports only its declared module.
"""

from __future__ import annotations

import copy
import importlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedtune.algorithms import registry
from fedtune.cli.main import main
from fedtune.config import parse_job
from fedtune.config.capabilities import Capabilities, capabilities_of, families, table
from fedtune.config.packages import smoke
from fedtune.core.errors import ConfigError
from fedtune.pipelines.catalog import repo_root
from fedtune.pipelines.run_form import family_of
from tests.integration.conftest import tiny_job_dict
from tests.integration.test_algorithm_table import JOB_OVERRIDES, TABLE

NAMES = registry.algorithm_names()


def _job(tmp_path: Path, name: str, **extra: Any) -> dict[str, Any]:
    rows = copy.deepcopy({"algorithm": TABLE[name], **JOB_OVERRIDES.get(name, {})})
    job = tiny_job_dict(tmp_path / "w", **rows)
    if smoke(name).single_tenant:  # its row has one tenant; the checks below need three
        job["tenants"] = tiny_job_dict(tmp_path / "w")["tenants"]
        job["min_clients"] = 2
    for key, value in extra.items():
        job[key] = {**job.get(key, {}), **value} if isinstance(value, dict) else value
    return job


def _refusal(tmp_path: Path, name: str, **extra: Any) -> str | None:
    try:
        parse_job(_job(tmp_path, name, **extra))
    except ConfigError as exc:
        return exc.render()
    return None


def test_every_registered_algorithm_declares_its_capabilities_once() -> None:
    assert sorted(table()) == NAMES == sorted(registry.BUILTIN)
    assert all(isinstance(c, Capabilities) for c in table().values())
    # The declared module registers exactly the names declared with it.
    for name, caps in table().items():
        importlib.import_module(caps.module)
        assert registry.get_algorithm(name).__module__ == caps.module


@pytest.mark.parametrize("name", NAMES)
def test_the_algorithm_object_reads_the_declaration(name: str, tmp_path: Path) -> None:
    job = parse_job(_job(tmp_path, name))
    algorithm = registry.get_algorithm(name)(job.algorithm)
    caps = capabilities_of(name)
    assert algorithm.capabilities is caps
    assert (algorithm.tenants_load_base, algorithm.tenant_keeps_model) == (
        caps.tenants_load_base, caps.tenant_keeps_model
    )


@pytest.mark.parametrize("name", NAMES)
def test_secure_aggregation_is_accepted_exactly_where_declared(name: str, tmp_path: Path) -> None:
    refused = _refusal(tmp_path, name, secure_aggregation={"enabled": True})
    if capabilities_of(name).summed_update:
        assert refused is None
    else:
        assert refused and f"algorithm {name!r}" in refused and "secure_aggregation" in refused


@pytest.mark.parametrize("name", NAMES)
def test_a_tenants_dp_sgd_is_accepted_exactly_where_declared(name: str, tmp_path: Path) -> None:
    job = _job(tmp_path, name)
    job["tenants"][0]["dp_sgd"] = {"noise_multiplier": 1.0, "max_grad_norm": 1.0}
    try:
        parse_job(job)
        refused = None
    except ConfigError as exc:
        refused = exc.render()
    why = capabilities_of(name).dp_sgd_refused
    if why is None:
        assert refused is None
    else:
        assert refused and why in refused and f"algorithm {name!r}" in refused


@pytest.mark.parametrize("name", NAMES)
def test_central_dp_is_accepted_exactly_where_declared(name: str, tmp_path: Path) -> None:
    dp = {"noise_multiplier": 1.0, "clipping": {"norm": 0.5}}
    algorithm = {**TABLE[name], "aggregation_weights": "uniform"} if "aggregation_weights" in (
        parse_job(_job(tmp_path, name)).algorithm.model_fields
    ) else TABLE[name]
    refused = _refusal(tmp_path, name, differential_privacy=dp, algorithm=algorithm)
    if capabilities_of(name).central_dp:
        assert refused is None
    else:
        assert refused and "whose update is not a mean of adapter deltas" in refused


@pytest.mark.parametrize("name", NAMES)
def test_the_audit_is_accepted_exactly_where_declared(name: str, tmp_path: Path) -> None:
    refused = _refusal(tmp_path, name, audit={"enabled": True})
    if capabilities_of(name).audit:
        assert refused is None
    else:
        assert refused and f"algorithm {name!r} cannot be audited" in refused
        assert "audit.enabled: false" in refused


def test_the_fedmkt_example_with_an_audit_validates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused once (its audit failed after training); now its tenants audit their own small
    models (tests/integration/test_fedmkt.py runs it to the end)."""
    example = yaml.safe_load((repo_root() / "examples" / "fedmkt.yaml").read_text())
    example["audit"] = {"enabled": True, "records": 4}
    path = tmp_path / "fedmkt-audit.yaml"
    path.write_text(yaml.safe_dump(example))
    assert main(["validate", str(path)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("name", NAMES)
def test_every_algorithm_has_the_committed_pipeline_of_its_declared_family(name: str) -> None:
    family = capabilities_of(name).family
    assert family_of(name) == family and name in families()[family]
    assert (repo_root() / "pipelines" / "compiled" / f"{family}.yaml").exists()
