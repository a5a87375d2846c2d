"""Start-up: the light commands import no torch, and the CLI output stays clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedtune.algorithms.registry import algorithm_names, get_algorithm
from fedtune.core.catalog import algorithm_catalog
from tests.integration.conftest import tiny_job_dict
from tests.integration.crash_helpers import fedtune_env, run

HEAVY = ("torch", "transformers", "peft", "mlflow", "deepspeed")
PROBE = """
import contextlib, io, sys
from fedtune.cli.main import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
print(",".join(m for m in {heavy!r} if m in sys.modules))
"""


@pytest.mark.parametrize(
    "args", [["--help"], ["algorithms"], ["validate", "examples/quickstart.yaml"], ["run", "--help"]]
)
def test_light_commands_import_no_torch(args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY), *args],
        env=fedtune_env(), capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"{args} imported {done.stdout.strip()}"


def test_the_catalog_matches_the_registry() -> None:
    catalog = algorithm_catalog()
    assert sorted(catalog) == algorithm_names()
    for name, doc in catalog.items():
        assert doc == (get_algorithm(name).__doc__ or "").strip().splitlines()[0]


def test_a_run_without_tracking_prints_no_registry_lines(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(tiny_job_dict(tmp_path / "w", rounds=1)), encoding="utf-8")
    done = run(["run", str(path), "--no-progress"])
    assert done.returncode == 0, done.stderr
    assert "registered version" not in done.stdout and "MLflow run" not in done.stdout
    assert "model: " in done.stdout and "summary: " in done.stdout
    # Library chatter (DeepSpeed's accelerator notice, shard bars) stays off stdout.
    assert "[WARNING]" not in done.stdout and "Writing model shards" not in done.stdout
    # Nor one library's deprecation notice about another (peft reading transformers).
    assert "Writing model shards" not in done.stderr and "FutureWarning" not in done.stderr
