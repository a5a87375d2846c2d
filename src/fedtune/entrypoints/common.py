"""What every entrypoint shares: reading the job, marker files, exit codes, the tracker.

An entrypoint is what a pod runs (``python -m fedtune.entrypoints.<step>``) and what a KFP
component body calls. It parses the job, calls one function of :mod:`fedtune.engines.steps`
and writes a small JSON *marker* (what the step did: bytes, seconds, metrics) for the next
task. State itself never travels in markers: it stays in the job's stores.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

from fedtune.config import format_validation_errors, load_job, parse_job
from fedtune.config.job import JobConfig
from fedtune.core.errors import ConfigError, FedtuneError, StoreError
from fedtune.engines import layout
from fedtune.engines.tenant.pod_io import JOB_ENV
from fedtune.tracking.base import NullTracker, Tracker
from fedtune.tracking.factory import make_tracker

if TYPE_CHECKING:
    from fedtune.config.tenant_view import TenantJob
    from fedtune.storage.base import Store

log = logging.getLogger(__name__)

TERMINATION_LOG_ENV = "FEDTUNE_TERMINATION_LOG"
"""Where a failing step writes its redacted failure (default ``/dev/termination-log``)."""

T = TypeVar("T")


def job_from_json(text: str, *, source: str) -> JobConfig:
    """Validate a job given as JSON text (paths in it are taken as they are)."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{source}: the job config is not valid JSON: {exc.msg} at line {exc.lineno}, "
            f"column {exc.colno}",
            fix="Pass the job as a JSON object (`fedtune compile` writes a valid default).",
        ) from None
    return parse_job(raw, source=source)


def read_job(path: str | None = None, text: str | None = None) -> JobConfig:
    """The job from a YAML/JSON file, from JSON text, or from ``$FEDTUNE_JOB_JSON``."""
    if path:
        return use_job_threads(load_job(path))
    if text:
        return use_job_threads(job_from_json(text, source="--job-json"))
    from_env = os.environ.get(JOB_ENV)
    if from_env:
        return use_job_threads(job_from_json(from_env, source=f"${JOB_ENV}"))
    raise ConfigError(
        "no job config given",
        fix=f"Pass --job JOB.yaml, --job-json '{{...}}', or set {JOB_ENV}.",
    )


def read_tenant_view(path: str | None = None, text: str | None = None) -> TenantJob:
    """A tenant's view of the job (what a launched pod is given) from a JSON file, JSON text
    or ``$FEDTUNE_JOB_JSON``.

    Raises:
        ConfigError: None given, not JSON, or not a tenant view (e.g. a whole job).
    """
    from pydantic import ValidationError

    from fedtune.config.tenant_view import TenantJob

    source, raw = (path, Path(path).read_text("utf-8")) if path else ("--job-json", text)
    if not raw:
        source, raw = f"${JOB_ENV}", os.environ.get(JOB_ENV)
    if not raw:
        raise ConfigError(
            "no tenant view of the job given",
            fix=f"Launched tenant pods get it in ${JOB_ENV} from the provider's launcher.",
        )
    try:
        return TenantJob.model_validate_json(raw)
    except ValidationError as exc:
        raise ConfigError(
            f"{source} is not a tenant's view of a job: {format_validation_errors(exc)}",
            fix="Launcher and tenant image must be the same fedtune version; a tenant pod is "
            "given its view of the job, never the whole job.",
        ) from None


def tenant_view_for(args: argparse.Namespace) -> TenantJob:
    """The view a launched pod's command line points at (``--job``/``--job-json``/env),
    checked to be ``--tenant``'s.

    Raises:
        ConfigError: No view, a malformed one, or another tenant's.
    """
    view = read_tenant_view(args.job, args.job_json)
    if view.name != args.tenant:
        raise ConfigError(
            f"--tenant {args.tenant!r}, but the view of the job given is tenant {view.name!r}'s",
            fix="The launcher passes each pod its own tenant's view; run the same fedtune version.",
        )
    return view


def write_job_artifact(path: str | Path, job: JobConfig) -> None:
    """Write the validated job as the JSON artifact every later task reads."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(job.model_dump(mode="json"), sort_keys=True), "utf-8")


def read_job_artifact(path: str | Path) -> JobConfig:
    """Read a job artifact written by :func:`write_job_artifact`."""
    return use_job_threads(job_from_json(Path(path).read_text("utf-8"), source=str(path)))


def use_job_threads(job: JobConfig) -> JobConfig:
    """Give this step ``engine.step_threads`` torch threads where the job sets them (else
    :func:`setup_logging` chose them from the pod's CPU quota); return ``job``."""
    if job.engine.step_threads:
        from fedtune.core.cpu import preset_threads

        preset_threads(job.engine.step_threads)
    return job


def write_marker(path: str | Path, data: dict[str, Any]) -> None:
    """Write a step's marker (small JSON) to an artifact path."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, sort_keys=True, default=str), "utf-8")


def read_marker(path: str | Path) -> dict[str, Any]:
    """Read a marker written by :func:`write_marker`."""
    try:
        data = json.loads(Path(path).read_text("utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise FedtuneError(
            f"cannot read the marker of an upstream task at {str(path)!r}: {exc}",
            fix="Re-run the pipeline; the upstream task did not finish writing its output.",
        ) from None
    if not isinstance(data, dict):
        raise FedtuneError(f"marker at {str(path)!r} is not a JSON object: {data!r}")
    return data


class MetricsSink(Protocol):
    """What a component body hands over for metrics: a KFP ``dsl.Metrics`` output."""

    def log_metric(self, metric: str, value: float) -> None: ...


def log_metrics(sink: MetricsSink | None, values: dict[str, Any]) -> None:
    """Log every finite number of ``values`` to ``sink`` (a run page's Metrics), sorted."""
    if sink is None:
        return
    for name, value in sorted(values.items()):
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if value == value and abs(value) != float("inf"):
            sink.log_metric(name, float(value))


def stored_run(store: Store) -> dict[str, Any]:
    """The run record server-init stored in the provider ``store`` (``{}`` before it ran)."""
    return store.get_json(layout.RUN_KEY) if store.exists(layout.RUN_KEY) else {}


def resume_tracker(job: JobConfig, store: Store) -> Tracker:
    """The tracker, attached to the run that the server-init step started and recorded in
    the provider ``store``.

    Raises:
        StoreError: The job tracks to MLflow and no run is recorded there. Starting a new one
            would scatter the job's metrics over runs that each hold a round.
    """
    tracker = make_tracker(job)
    if isinstance(tracker, NullTracker):  # tracking off: nothing is logged, no run to attach
        tracker.start(run_name=job.name, params={}, tags={})
        return tracker
    record = stored_run(store)
    run_id = record.get("run_id")
    if not isinstance(run_id, str) or not run_id:
        state = f"{layout.RUN_KEY} has no run_id" if record else f"there is no {layout.RUN_KEY}"
        raise StoreError(
            f"the provider store holds no tracking run of job {job.name!r} ({state})",
            fix="Run the job's pipeline from its server-init step, which starts the run and "
            "records it; a later step cannot run before it.",
        )
    tracker.start(run_name=job.name, params={}, tags={}, run_id=run_id)
    return tracker


def guarded(call: Callable[[], T]) -> T:
    """Run ``call``; a :class:`FedtuneError` becomes its message on stderr and its exit code.

    Component bodies and ``main`` functions go through this, so a failing pod shows the
    message and fix a user can act on, and exits with the error's documented code.
    """
    try:
        return call()
    except FedtuneError as exc:
        sys.stderr.write(exc.render() + "\n")  # the pod's own log: its owner's eyes only
        sys.stderr.flush()
        write_termination_message(exc)
        raise SystemExit(exc.exit_code) from None


def write_termination_message(exc: FedtuneError) -> None:
    """Leave the redacted failure where Kubernetes puts it in the pod status.

    Only in a container (the file exists) or when ``$FEDTUNE_TERMINATION_LOG`` names a path;
    a failure to write it must not hide the error itself.
    """
    path = os.environ.get(TERMINATION_LOG_ENV) or "/dev/termination-log"
    if not (os.environ.get(TERMINATION_LOG_ENV) or os.path.exists(path)):
        return
    try:
        Path(path).write_text(exc.redacted().to_json(), "utf-8")
    except OSError as err:
        log.warning("could not write the termination message to %s: %s", path, err)


def setup_logging(verbose: bool = False) -> None:
    """Set up a step's process: INFO-level logs to stderr, as pods and the KFP UI show
    them, and torch threads for the CPUs the pod may use (its CPU limit, not the node's
    cores; ``$FEDTUNE_THREADS`` overrides it, see :mod:`fedtune.core.cpu`)."""
    from fedtune.core.cpu import preset_threads, threads_for

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    preset_threads(threads_for())


def job_parser(description: str, step: str) -> argparse.ArgumentParser:
    """The arguments every entrypoint takes: the job and where to write its marker."""
    parser = argparse.ArgumentParser(
        prog=f"python -m fedtune.entrypoints.{step}", description=description
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--job", metavar="PATH", help="job YAML or JSON file")
    source.add_argument("--job-json", metavar="JSON", help=f"job as JSON text (else ${JOB_ENV})")
    parser.add_argument("--result", metavar="PATH", help="write the step's JSON marker here")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    return parser


def finish_main(result: dict[str, Any], path: str | None) -> NoReturn:
    """Write the marker (to ``path`` or stdout) and exit 0."""
    if path:
        write_marker(path, result)
    else:
        sys.stdout.write(json.dumps(result, sort_keys=True, default=str) + "\n")
    raise SystemExit(0)


def run_main(
    parse: Callable[[Sequence[str] | None], argparse.Namespace],
    body: Callable[[argparse.Namespace], dict[str, Any]],
    argv: Sequence[str] | None,
) -> NoReturn:
    """Parse ``argv``, run ``body`` under :func:`guarded`, write its marker, exit."""
    args = parse(argv)
    setup_logging(getattr(args, "verbose", False))
    result = guarded(lambda: body(args))
    finish_main(result, getattr(args, "result", None))
