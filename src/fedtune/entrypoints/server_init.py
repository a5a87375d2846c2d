"""Provider, once per run: validate the job, start (or resume) tracking, write the initial state.

``python -m fedtune.entrypoints.server_init --job JOB.yaml [--plan PLAN.json]``

The job-config parameter of a compiled pipeline can be edited in the KFP UI, so this step
also checks the job against the shape the pipeline was compiled for, and that a chained run
(``--start-round`` > 1) finds the state of the round before it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from fedtune.config.job import JobConfig
from fedtune.core.errors import ConfigError
from fedtune.core.messages import ServerState
from fedtune.engines import layout, steps
from fedtune.engines.fingerprint import check_resumable, run_record
from fedtune.engines.local import log_initial_state
from fedtune.entrypoints import common
from fedtune.pipelines.plan import PipelinePlan
from fedtune.storage.base import Store
from fedtune.tracking.base import Tracker
from fedtune.tracking.factory import make_tracker


def _check_plan(env: steps.ProviderEnv, plan: PipelinePlan) -> None:
    problems = plan.mismatches(env.job)
    if problems:
        raise ConfigError(
            f"the job config does not fit the pipeline compiled for job {plan.job!r}: "
            + "; ".join(problems),
            fix="Edit only hyperparameters and URIs in the KFP form, or recompile with "
            "`fedtune compile JOB.yaml -o PIPELINE.yaml` and upload the new pipeline.",
        )
    previous = plan.start_round - 1
    if previous and not ServerState.stored(env.store(), layout.state_key(previous)):
        raise ConfigError(
            f"this run starts at round {plan.start_round}, but the provider store "
            f"{env.store().uri} holds no server state of round {previous}",
            fix=f"Run rounds 1-{previous} first (a run with --start-round 1), then this one.",
        )


def _start_tracking(env: steps.ProviderEnv) -> tuple[Tracker, str]:
    """Check the stored run record, then create or resume the tracker run."""
    store = env.store()
    stored: dict[str, Any] = store.get_json(layout.RUN_KEY) if store.exists(layout.RUN_KEY) else {}
    info = check_resumable(stored, env.job, store.uri) if stored else {}
    tracker = make_tracker(env.job)
    params = (
        {}
        if info
        else {"job": env.job.model_dump(mode="json"), "algorithm": env.algorithm.params()}
    )
    run_id = tracker.start(
        run_name=env.job.name,
        params=params,
        tags={"fedtune.algorithm": env.job.algorithm.name, "fedtune.engine": "kfp"},
        run_id=info.get("run_id"),
    )
    if info.get("run_id") != run_id or info != stored:
        store.put_json(layout.RUN_KEY, {**run_record(env.job), "run_id": run_id})
    return tracker, run_id


def initial_run_info(store: Store) -> dict[str, Any]:
    """What the algorithm recorded about the run when it initialised (e.g. a layer split)."""
    return dict(store.get_json(f"{layout.state_key(0)}.json").get("run_info") or {})


def run(job: JobConfig, plan: PipelinePlan | None = None) -> dict[str, Any]:
    """Check the job, start tracking and write the initial state; return the state marker."""
    env = steps.ProviderEnv.create(job)
    if plan is not None:
        _check_plan(env, plan)
    tracker, run_id = _start_tracking(env)
    result = steps.init_step(env)
    log_initial_state(env, tracker)
    start = plan.start_round if plan is not None else 1
    return {"round": start - 1, "run_id": run_id, "init": result}


def component(job_config: str, plan: str, job_path: str, state_path: str) -> None:
    """Body of the ``server-init`` KFP component."""

    def body() -> None:
        job = common.job_from_json(job_config, source="job_config parameter")
        common.write_job_artifact(job_path, job)
        common.write_marker(state_path, run(job, PipelinePlan.from_json(plan) if plan else None))

    common.setup_logging()
    common.guarded(body)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = common.job_parser(__doc__.splitlines()[0], "server_init")
    parser.add_argument("--plan", metavar="JSON", help="the compiled pipeline's plan to check")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line of the step."""
    common.run_main(
        _parse,
        lambda a: run(
            common.read_job(a.job, a.job_json), PipelinePlan.from_json(a.plan) if a.plan else None
        ),
        argv,
    )


if __name__ == "__main__":
    main()
