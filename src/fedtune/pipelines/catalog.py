"""The committed compiled files: one pipeline per algorithm family, one YAML per component.

``pipelines/compiled/<family>.yaml`` is compiled from ``pipelines/jobs/<family>.yaml`` (for
upload in the KFP UI), ``pipelines/compiled/<family>-gpu.yaml`` from the same job with
:data:`GPU_PROVIDER` (its heavy provider steps on one GPU, in the GPU image), and the Helm
chart ships every one of them as ``charts/fedtune/files/pipelines/<pipeline name>.yaml``,
the name its upload Job gives the pipeline in KFP (``fedtune-fedit``, ``fedtune-fedit-gpu``,
...). ``components/<name>/component.yaml`` is each component's own spec, for reuse in other
pipelines. They are generated, never edited:

    python -m fedtune.pipelines.catalog --write    # regenerate
    python -m fedtune.pipelines.catalog --check    # exit 1 when any is stale

A test runs the check, so a change to a component, the builder or a job file that is not
recompiled fails CI. A job file whose algorithm's package is gone, and what was compiled from
it, is named first (no compile needed to see it): the job file is the one hand-written file a
deleted algorithm leaves behind.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import yaml
from kfp import compiler

from fedtune.algorithms.registry import algorithm_names
from fedtune.config import load_job
from fedtune.config.job import JobConfig, ProviderResources
from fedtune.pipelines.builder import ClusterSettings
from fedtune.pipelines.compiling import compile_job
from fedtune.pipelines.components import COMPONENTS
from fedtune.pipelines.job_files import job_algorithm, job_files

COMMITTED_SETTINGS = ClusterSettings(
    s3_endpoint="http://fedtune-minio.fedtune.svc.cluster.local:9000",
)
"""The chart's defaults for a release named ``fedtune`` in namespace ``fedtune``."""

GPU_PROVIDER = ProviderResources(
    gpu=1, tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
)
"""The provider section of the shipped GPU variants: one GPU and the usual GPU-node taint."""

CHART_PIPELINES = Path("charts") / "fedtune" / "files" / "pipelines"


def pipeline_name_of(text: str) -> str:
    """The name a compiled pipeline file gives itself (``pipelineInfo.name``)."""
    return str(next(yaml.safe_load_all(text))["pipelineInfo"]["name"])


def variants(job: JobConfig, stem: str) -> dict[str, JobConfig]:
    """The committed pipelines of one job file: as written and, for a job that asks for no
    provider resources, its GPU variant."""
    if job.provider != ProviderResources():
        return {stem: job}
    return {stem: job, f"{stem}-gpu": job.model_copy(update={"provider": GPU_PROVIDER})}


def repo_root() -> Path:
    """The source checkout this package lives in (``src/fedtune/pipelines/`` -> root)."""
    return Path(__file__).resolve().parents[3]


def render(root: Path) -> dict[Path, str]:
    """Every committed compiled file and the text it must have."""
    outputs: dict[Path, str] = {}
    compiled, skipped = job_files(root)
    for job_file in skipped:
        sys.stderr.write(
            f"skipped {job_file.relative_to(root)}: its algorithm is not installed (delete it; "
            "--check fails while it is there)\n"
        )
    with tempfile.TemporaryDirectory(prefix="fedtune-catalog-") as tmp:
        for job_file in compiled:
            for stem, job in variants(load_job(job_file), job_file.stem).items():
                out = Path(tmp) / f"{stem}.yaml"
                compile_job(job, out, settings=COMMITTED_SETTINGS)
                text = out.read_text("utf-8")
                outputs[root / "pipelines" / "compiled" / out.name] = text
                outputs[root / CHART_PIPELINES / f"{pipeline_name_of(text)}.yaml"] = text
        for name, component in COMPONENTS.items():
            out = Path(tmp) / f"{name}.yaml"
            compiler.Compiler().compile(component, str(out))
            outputs[root / "components" / name / "component.yaml"] = out.read_text("utf-8")
    return outputs


def orphans(root: Path) -> list[str]:
    """One line for each job file whose algorithm no installed package declares, and for each
    committed file compiled from it (read from the files, without compiling)."""
    lines: list[str] = []
    _, skipped = job_files(root)
    for job_file in skipped:
        lines.append(
            f"{job_file.relative_to(root)}: algorithm {job_algorithm(job_file)!r} has no package "
            f"under src/fedtune/algorithms (installed: {', '.join(algorithm_names())}); delete "
            "this job file, then run `python -m fedtune.pipelines.catalog --write`"
        )
        for stem in (job_file.stem, f"{job_file.stem}-gpu"):  # as :func:`variants` names them
            compiled = root / "pipelines" / "compiled" / f"{stem}.yaml"
            if not compiled.exists():
                continue
            generated = [compiled, root / CHART_PIPELINES / f"{_name_in(compiled)}.yaml"]
            lines += [
                f"{path.relative_to(root)}: compiled from {job_file.relative_to(root)}, whose "
                "algorithm is gone; `--write` deletes it"
                for path in generated
                if path.exists()
            ]
    return lines


def _name_in(compiled: Path) -> str:
    # libyaml where present: a compiled pipeline is ~100 KB.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    first = next(yaml.load_all(compiled.read_text("utf-8"), Loader=loader))
    return str(first["pipelineInfo"]["name"])


def stale(root: Path) -> list[Path]:
    """Committed files that differ from a fresh compile, are missing, or have no source."""
    expected = render(root)
    found = {
        *(root / "pipelines" / "compiled").glob("*.yaml"),
        *(root / CHART_PIPELINES).glob("*.yaml"),
        *(root / "components").glob("*/component.yaml"),
    }
    problems = [p for p, text in expected.items() if not p.exists() or p.read_text("utf-8") != text]
    return sorted(set(problems) | (found - set(expected)))


def write(root: Path) -> list[Path]:
    """Regenerate every committed file; return the paths written."""
    outputs = render(root)
    for folder in (root / "pipelines" / "compiled", root / CHART_PIPELINES):
        for path in folder.glob("*.yaml"):  # a pipeline that is no longer generated
            if path not in outputs:
                path.unlink()
    for path, text in outputs.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, "utf-8")
    return sorted(outputs)


def main(argv: Sequence[str] | None = None) -> int:
    """``--write`` regenerates, ``--check`` lists stale files (exit 1 if any)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate the committed files")
    mode.add_argument("--check", action="store_true", help="exit 1 when any file is stale")
    parser.add_argument("--root", type=Path, default=repo_root(), help="repository root")
    args = parser.parse_args(argv)
    if args.write:
        for path in write(args.root):
            sys.stdout.write(f"wrote {path.relative_to(args.root)}\n")
        return 0
    gone = orphans(args.root)
    if gone:  # the rest is compared once these are gone (a compile takes seconds)
        sys.stdout.write("".join(f"orphan: {line}\n" for line in gone))
        return 1
    problems = stale(args.root)
    for path in problems:
        sys.stdout.write(f"stale: {path.relative_to(args.root)}\n")
    if problems:
        sys.stdout.write("run `python -m fedtune.pipelines.catalog --write` to regenerate them\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
