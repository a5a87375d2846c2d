"""Provider, after the last round: record final metrics, export the models, register them.

``python -m fedtune.entrypoints.export_and_register --job JOB.yaml [--eval-marker PATH ...]``

Writes the same stored summary parts as the local engine (final evaluation, artifacts with
their store URIs and registered versions) and closes the tracker run.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from fedtune.config.job import JobConfig
from fedtune.engines import layout, steps
from fedtune.engines.local import export_and_register
from fedtune.entrypoints import common

ARTIFACTS_KEY = "summary/artifacts.json"
"""Where the exported artifacts' URIs and registry versions are stored (provider store)."""


def run(job: JobConfig, eval_markers: list[dict[str, Any]]) -> dict[str, Any]:
    """Store the final evaluation, export and register the final models; return the record."""
    env = steps.ProviderEnv.create(job)
    store = env.store()
    by_tenant = {m["tenant"]: dict(m["metrics"]) for m in eval_markers}
    final_eval = {t.name: by_tenant[t.name] for t in job.tenants if t.name in by_tenant}
    store.put_json(layout.FINAL_EVAL_KEY, final_eval)
    run_id = store.get_json(layout.RUN_KEY).get("run_id") if store.exists(layout.RUN_KEY) else None
    tracker = common.resume_tracker(job, run_id)
    try:
        artifacts = export_and_register(env, tracker, final_eval)
        tracker.end("FINISHED")
    except BaseException:
        tracker.end("FAILED")
        raise
    store.put_json(ARTIFACTS_KEY, artifacts)
    return {"artifacts": artifacts, "final_eval": final_eval}


def component(job_path: str, metrics_paths: list[str], artifacts_path: str) -> None:
    """Body of the ``export-and-register`` KFP component."""

    def body() -> None:
        job = common.read_job_artifact(job_path)
        result = run(job, [common.read_marker(p) for p in metrics_paths])
        common.write_marker(artifacts_path, result)

    common.setup_logging()
    common.guarded(body)


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
