"""Provider, after the last round: record final metrics, export the models, register them.

``python -m fedtune.entrypoints.export_and_register --job JOB.yaml [--eval-marker PATH ...]``

Writes the same stored summary parts as the local engine (final evaluation, artifacts with
their store URIs and registered versions) and closes the tracker run. Once stored, the record
is what a repeated step returns: one training never registers a model version twice.

In a pipeline the exported models also become typed ``dsl.Model`` outputs: ``model`` (the
run's main model: ``model`` where the family exports one under that name, else the first
registered by name, e.g. FedBiOT's AdapEmu, FedMKT's SLM) and ``companion`` (the family's
other registered model: FedPT's small model, FedBiOT's AdapFu; marked ``exported: false``
where there is none). Each carries a small JSON manifest and, as metadata, its registered
name and version, the MLflow run id, its layout and its store URI; the weights stay in the
store (a pipeline root is no place for a copy of an LLM).
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from fedtune.config.job import JobConfig
from fedtune.engines import layout, steps
from fedtune.entrypoints import common

log = logging.getLogger(__name__)

ARTIFACTS_KEY = "summary/artifacts.json"
"""Where the exported artifacts' URIs and registry versions are stored (provider store)."""


def run(job: JobConfig, eval_markers: list[dict[str, Any]]) -> dict[str, Any]:
    """Store the final evaluation, export and register the final models; return the record.

    When an earlier attempt stored the artifacts record, return it without exporting again.
    """
    env = steps.ProviderEnv.create(job)
    store = env.store()
    if store.exists(ARTIFACTS_KEY) and store.exists(layout.FINAL_EVAL_KEY):
        log.info("job %s: final models already exported and registered; not again", job.name)
        return {
            "artifacts": store.get_json(ARTIFACTS_KEY),
            "final_eval": store.get_json(layout.FINAL_EVAL_KEY),
            "skipped": True,
        }
    from fedtune.core.update_meta import check_eval_metrics
    from fedtune.engines.local import export_and_register  # torch and PEFT: exporting only

    # Numbers under declared keys only: a tenant's evaluation goes into MLflow and the summary.
    by_tenant = {m["tenant"]: check_eval_metrics(m["tenant"], m["metrics"]) for m in eval_markers}
    final_eval = {t.name: by_tenant[t.name] for t in job.tenants if t.name in by_tenant}
    store.put_json(layout.FINAL_EVAL_KEY, final_eval)
    tracker = common.resume_tracker(job, store)
    try:
        artifacts = export_and_register(env, tracker, final_eval)
        tracker.end("FINISHED")
    except BaseException:
        tracker.end("FAILED")
        raise
    store.put_json(ARTIFACTS_KEY, artifacts)
    return {"artifacts": artifacts, "final_eval": final_eval}


class ModelOutput(Protocol):
    """A KFP ``dsl.Model`` output, as the component body hands it over."""

    path: str
    metadata: dict[str, Any]


def model_roles(artifacts: dict[str, Any]) -> tuple[str | None, str | None]:
    """Names of the main and companion models among the exported ``artifacts``."""
    registered = sorted(n for n, a in artifacts.items() if a.get("registered_name"))
    names = registered or sorted(artifacts)
    main = "model" if "model" in artifacts else (names[0] if names else None)
    others = [n for n in names if n != main]
    return main, (others[0] if others else None)


def describe_model(
    out: ModelOutput, name: str | None, artifacts: dict[str, Any], mlflow_run_id: str | None
) -> None:
    """Fill a ``dsl.Model`` output: metadata for the run page and a JSON manifest file."""
    entry = artifacts.get(name) if name else None
    if entry is None:
        manifest: dict[str, Any] = {"exported": False}
    else:
        manifest = {
            "exported": True,
            "name": name,
            "layout": entry.get("kind"),
            "store_uri": entry.get("uri"),
            "registered_name": entry.get("registered_name"),
            "registered_version": entry.get("registered_version"),
            "model_uri": entry.get("model_uri"),
            "mlflow_run_id": mlflow_run_id,
        }
        manifest = {k: v for k, v in manifest.items() if v is not None}
    out.metadata.update(manifest)
    Path(out.path).parent.mkdir(parents=True, exist_ok=True)
    Path(out.path).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", "utf-8")


def component(
    job_path: str,
    metrics_paths: list[str],
    artifacts_path: str,
    model: ModelOutput | None = None,
    companion: ModelOutput | None = None,
    final_metrics: common.MetricsSink | None = None,
) -> tuple[bool, list[str]]:
    """Body of the ``export-and-register`` KFP component: (audit on, audited tenants)."""

    def body() -> tuple[bool, list[str]]:
        job = common.read_job_artifact(job_path)
        result = run(job, [common.read_marker(p) for p in metrics_paths])
        common.write_marker(artifacts_path, result)
        store = steps.ProviderEnv.create(job).store()
        run_id = common.stored_run(store).get("run_id")
        main, second = model_roles(result["artifacts"])
        for out, name in ((model, main), (companion, second)):
            if out is not None:
                describe_model(out, name, result["artifacts"], run_id)
        common.log_metrics(
            final_metrics,
            {f"{k}/{t}": v for t, m in result["final_eval"].items() for k, v in m.items()},
        )
        audited = list(job.audited_tenants)
        return bool(audited), audited

    common.setup_logging()
    return common.guarded(body)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = common.job_parser(__doc__.splitlines()[0], "export_and_register")
    parser.add_argument(
        "--eval-marker", metavar="PATH", action="append", default=[], help="an evaluate marker"
    )
    return parser.parse_args(argv)


def _body(args: argparse.Namespace) -> dict[str, Any]:
    job = common.read_job(args.job, args.job_json)
    return run(job, [common.read_marker(p) for p in args.eval_marker])


def main(argv: Sequence[str] | None = None) -> None:
    """Command line of the step."""
    common.run_main(_parse, _body, argv)


if __name__ == "__main__":
    main()
