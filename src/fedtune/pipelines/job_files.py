"""The pipeline job files (``pipelines/jobs/*.yaml``) the catalog compiles, without kfp.

A job file is compiled when its algorithm is installed: deleting an algorithm's package
removes its pipelines at the next ``python -m fedtune.pipelines.catalog --write``, and
``--check`` names the job file left behind until it is deleted too.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from fedtune.algorithms.registry import algorithm_names


def job_algorithm(job_file: Path) -> str | None:
    """The ``algorithm.name`` a job file names, if it names one."""
    raw = yaml.safe_load(job_file.read_text("utf-8"))
    algorithm = raw.get("algorithm") if isinstance(raw, dict) else None
    name = algorithm.get("name") if isinstance(algorithm, dict) else None
    return name if isinstance(name, str) else None


def job_files(root: Path) -> tuple[list[Path], list[Path]]:
    """The job files under ``pipelines/jobs`` to compile, and those skipped because their
    algorithm's package is not installed (deleting a package removes its pipelines)."""
    installed = set(algorithm_names())
    compiled: list[Path] = []
    skipped: list[Path] = []
    for job_file in sorted((root / "pipelines" / "jobs").glob("*.yaml")):
        name = job_algorithm(job_file)
        (skipped if name is not None and name not in installed else compiled).append(job_file)
    return compiled, skipped
