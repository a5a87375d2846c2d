"""Provider, once per run: read the job, start (or resume) tracking, write the initial state.

``python -m fedtune.entrypoints.server_init --job JOB.yaml``

In a pipeline the job comes from the run form (:mod:`fedtune.pipelines.run_form`): read from
``job_uri`` or ``job_config``, overridden, checked against the pipeline's family and scoped to
the run's state prefix. The step then lists the rounds still to train, which the pipeline's
round loop iterates over: the graph does not depend on rounds or tenants.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from fedtune.config.job import JobConfig
from fedtune.engines import layout, retention, steps
from fedtune.engines.fingerprint import check_resumable, run_record
from fedtune.engines.provider import ranks
from fedtune.entrypoints import common
from fedtune.pipelines.run_form import RunForm, open_rounds, resolve_job
from fedtune.storage.base import Store
from fedtune.tracking.base import Tracker
from fedtune.tracking.factory import make_tracker


def _start_tracking(env: steps.ProviderEnv, form: RunForm | None = None) -> tuple[Tracker, str]:
    """Check the stored run record, then create or resume the tracker run."""
    store = env.store()
    stored = common.stored_run(store)
    info = check_resumable(stored, env.job, store.uri) if stored else {}
    tracker = make_tracker(env.job)
    params = (
        {}
        if info
        else {"job": env.job.model_dump(mode="json"), "algorithm": env.algorithm.params()}
    )
    tags = {"fedtune.algorithm": env.job.algorithm.name, "fedtune.engine": "kfp"}
    if form is not None and form.kfp_run_id:
        tags["fedtune.kfp_run_id"] = form.kfp_run_id
    if form is not None and form.run_label:
        tags["fedtune.run_label"] = form.run_label
    run_id = tracker.start(
        run_name=form.run_label if form is not None and form.run_label else env.job.name,
        params=params,
        tags=tags,
        run_id=info.get("run_id"),
    )
    if info.get("run_id") != run_id or info != stored:
        store.put_json(layout.RUN_KEY, {**run_record(env.job), "run_id": run_id})
    return tracker, run_id


def initial_run_info(store: Store) -> dict[str, Any]:
    """What the algorithm recorded about the run when it initialised (e.g. a layer split)."""
    return dict(store.get_json(f"{layout.state_key(0)}.json").get("run_info") or {})


def run(job: JobConfig, form: RunForm | None = None) -> dict[str, Any]:
    """Start tracking and write the initial state; return the state marker with the rounds
    still to train (see :func:`fedtune.pipelines.run_form.open_rounds`)."""
    from fedtune.engines.local import log_initial_state  # the local engine's imports: lazily

    env = steps.ProviderEnv.create(job)
    tracker, run_id = _start_tracking(env, form)
    privacy: dict[str, Any] = {}
    if job.differential_privacy is not None:  # as the local engine: only rounds that fit the budget
        from fedtune.engines import privacy_steps  # torch: only for DP jobs

        job, privacy = privacy_steps.plan_rounds(job, env.store())
        env = steps.ProviderEnv.create(job)
    result = ranks.provider_step(env, "init")
    log_initial_state(env, tracker)
    store = env.store()
    done = [retention.round_recorded(store, r) for r in range(1, job.rounds + 1)]
    rounds = open_rounds(done, form.stop_after_round if form is not None else 0)
    return {
        "round": rounds[0] - 1,
        "rounds": rounds,
        "run_id": run_id,
        "init": result,
        "job_rounds": job.rounds,
        **({"privacy": privacy} if privacy else {}),
    }


def component(
    form: RunForm, family: str, job_path: str, state_path: str, secure: bool = False
) -> list[int]:
    """Body of the ``server-init`` KFP component: the rounds the loop iterates over
    (``secure``: the pipeline is its family's secure-aggregation variant)."""

    def body() -> list[int]:
        job = resolve_job(form, family, secure)
        marker = run(job, form)
        # Later steps see the rounds a privacy budget lets run (the model of the last is exported).
        common.write_job_artifact(job_path, job.model_copy(update={"rounds": marker["job_rounds"]}))
        common.write_marker(state_path, marker)
        return list(marker["rounds"])

    common.setup_logging()
    return common.guarded(body)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    return common.job_parser(__doc__.splitlines()[0], "server_init").parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line of the step."""
    common.run_main(
        _parse,
        lambda a: run(common.read_job(a.job, a.job_json)),
        argv,
    )


if __name__ == "__main__":
    main()
