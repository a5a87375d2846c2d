"""The kfp-local engine: run the job's family pipeline with ``kfp.local``.

The very components that run on a cluster run here, each task a subprocess of this Python
(``SubprocessRunner(use_venv=False)``: nothing is installed, nothing downloaded), from the
same compiled family pipeline a cluster gets, the job passed as its ``job_config`` argument.
Outside a cluster the tenant launcher runs tenant steps in-process, and the stores are the
job's local folders; the run keeps its state under the job's name (``resume_run_id`` =
:data:`~fedtune.pipelines.run_form.JOB_SCOPE`), so a kfp-local run leaves exactly the stored
state of a local-engine run and ends with the same summary structure. Resuming works the same
way: the round loop starts at the first round whose state and record are not stored yet, and
every step skips stored output.
"""

from __future__ import annotations

import builtins
import json
import logging
import os
import re
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedtune.config.job import JobConfig
from fedtune.core.devices import resolve_device
from fedtune.core.errors import ConfigError, FedtuneError
from fedtune.engines import layout, steps
from fedtune.engines.local import RunOptions, discard_stored_run, preflight
from fedtune.engines.summary import RoundRecord, build_summary

log = logging.getLogger(__name__)

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _prepare(env: steps.ProviderEnv, options: RunOptions) -> None:
    """The local engine's rules for stored state: refuse, resume, or start fresh."""
    store, job = env.store(), env.job
    if not store.exists(layout.RUN_KEY):
        return
    if options.fresh:
        discard_stored_run(env)
    elif not options.resume:
        raise ConfigError(
            f"job {job.name!r} already has stored state at {store.uri}",
            fix="Pass --resume to continue it, --fresh to discard it, or rename the job.",
        )
    # With --resume the server-init task checks that the job did not change.


@contextmanager
def _importable_package() -> Iterator[None]:
    """Make sure task subprocesses import this very fedtune (also from a source tree)."""
    import fedtune

    src = str(Path(fedtune.__file__).resolve().parents[1])
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (src, previous) if p)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous


def _execute(pipeline_yaml: Path, pipeline_root: Path, arguments: dict[str, Any]) -> None:
    """Run a compiled pipeline with kfp.local's subprocess runner."""
    from kfp import components, local

    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(pipeline_root),
        raise_on_error=True,
    )
    pipeline = components.load_component_from_file(str(pipeline_yaml))
    # kfp.local indents output by swapping builtins.print per task; parallel loop iterations
    # restore each other's swaps out of order and leave it indented, so put it back here.
    saved_print = builtins.print
    from fedtune.pipelines.kfp_tasks import forked_tasks

    with warnings.catch_warnings(), _importable_package(), forked_tasks():
        # Known and harmless locally: the image is ignored, display names are not shown.
        warnings.filterwarnings("ignore", message=".*non-Python base image.*")
        warnings.filterwarnings("ignore", message=".*have no effect in the current local runner.*")
        try:
            pipeline(**arguments)
        except RuntimeError as exc:
            raise FedtuneError(
                f"the kfp-local pipeline failed: {_ANSI.sub('', str(exc))}",
                fix="The failing task's log above ends with its error and fix; correct it and "
                "run again with --resume (finished steps are kept).",
            ) from None
        finally:
            builtins.print = saved_print


def run_job(
    job: JobConfig, options: RunOptions | None = None, pipeline_file: Path | None = None
) -> dict[str, Any]:
    """Run (or resume) a job through its family pipeline; return the run summary.

    ``pipeline_file`` is a compiled family pipeline to run (default: compile one now).
    Tracking happens inside the tasks (server init starts or resumes the MLflow run recorded
    in the provider store, aggregate logs each round, export registers and closes it).
    """
    from fedtune.engines import privacy_steps
    from fedtune.entrypoints.export_and_register import ARTIFACTS_KEY
    from fedtune.entrypoints.server_init import initial_run_info
    from fedtune.pipelines.builder import compile_pipeline
    from fedtune.pipelines.run_form import JOB_SCOPE, family_of

    resolve_device(job.training)  # before anything is stored
    options = options or RunOptions()
    env = steps.ProviderEnv.create(job)
    store = env.store()
    _prepare(env, options)
    preflight(steps.TenantEnvs(job))
    given = job  # as given: server-init plans the privacy budget itself, as here
    privacy_note: dict[str, Any] = {}
    if job.differential_privacy is not None:  # the rounds server-init will let run
        job, privacy_note = privacy_steps.plan_rounds(job, store)
    last = min(job.rounds, options.until_round or job.rounds)
    arguments = {
        "job_config": json.dumps(given.model_dump(mode="json"), sort_keys=True),
        "resume_run_id": JOB_SCOPE,
        "stop_after_round": last if last < job.rounds else 0,
    }
    log.info("kfp-local: job %s, rounds up to %d", job.name, last)
    with tempfile.TemporaryDirectory(prefix="fedtune-kfp-") as tmp:
        if pipeline_file is None:
            family = family_of(job.algorithm.name)
            pipeline_file = compile_pipeline(
                family,
                Path(tmp) / "pipeline.yaml",
                None,
                provider=job.provider,
                secure=job.secure_aggregation.enabled,
            )
        _execute(pipeline_file, env.stores.workdir / "kfp-local" / job.name, arguments)
    records = [
        RoundRecord.from_json(store.get_json(layout.summary_key(r))) for r in range(1, last + 1)
    ]
    run_id = store.get_json(layout.RUN_KEY).get("run_id")
    completed = last == job.rounds
    summary = build_summary(
        job,
        records,
        run_id=run_id,
        completed=completed,
        artifacts=store.get_json(ARTIFACTS_KEY) if completed else None,
        final_eval=store.get_json(layout.FINAL_EVAL_KEY) if completed else None,
        run_info=initial_run_info(store),
        audit=store.get_json(layout.AUDIT_KEY) if completed and job.audited_tenants else None,
    )
    from fedtune.engines.workers import peak_memory

    # As the local engine's summary: this (orchestrating) process's peak; tasks run apart.
    summary["engine_peak_rss_mib"] = peak_memory("cpu")["peak_rss_mib"]
    if job.differential_privacy is not None:  # as the local engine's summary
        summary["privacy"] = privacy_steps.summary(job, store, privacy_note)
    return summary
