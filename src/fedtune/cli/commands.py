"""Subcommands: validate, run, algorithms (partition and bench live in their own modules)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fedtune.cli.arguments import add_set_option, positive_int
from fedtune.config import load_job
from fedtune.core.devices import resolve_device
from fedtune.core.errors import StopRequested
from fedtune.tracking.base import NullTracker
from fedtune.tracking.factory import make_tracker

out = Console(highlight=False)

Registrar = Callable[[Any], None]


# -- validate -------------------------------------------------------------------------------
def _validate(args: argparse.Namespace) -> int:
    job = load_job(args.job, args.overrides)
    resolve_device(job.training)  # training.device/precision against this machine
    if args.deep:
        from fedtune.engines.preflight import run_checks
        from fedtune.engines.steps import TenantEnvs

        for warning in run_checks(job, tenants=TenantEnvs(job)):
            out.print(f"[yellow]warning:[/] {escape(warning)}")
    _print_hub_models(job.model_dump())
    out.print(
        f"[green]ok[/] {args.job}{' (deep)' if args.deep else ''}"
        f"{f' with {len(args.overrides)} override(s)' if args.overrides else ''}: job [bold]{job.name}[/], "
        f"algorithm {job.algorithm.name}, "
        f"{len(job.tenants)} tenants, {job.rounds} rounds, {job.sampled_per_round} per round"
    )
    return 0


def _print_hub_models(dump: dict[str, Any]) -> None:
    """Say where each hub id of the job is read from (plain validate opens nothing else)."""
    from fedtune.models.hub import describe, hub_references

    for field, uri in hub_references(dump):
        out.print(f"{field}: {escape(describe(uri))}", soft_wrap=True)


def register_validate(sub: Any) -> None:
    p = sub.add_parser(
        "validate",
        help="check a job file and list every problem at once",
        description="Validate JOB.yaml. Each problem is printed with its field path and a fix; "
        "the exit code is 2 when any problem is found.",
    )
    p.add_argument("job", help="path of the job YAML file")
    add_set_option(p)
    p.add_argument(
        "--deep",
        action="store_true",
        help="also open what a run opens: the workdir, every tenant's data, the tokenizer, the "
        "model and its LoRA targets, the stores and the tracking server (short timeouts); "
        "`run` does the same before it stores anything",
    )
    p.set_defaults(handler=_validate)


# -- run ------------------------------------------------------------------------------------
def _run(args: argparse.Namespace) -> int:
    import os

    from fedtune.cli import run_log
    from fedtune.core.cpu import THREADS_ENV, apply_threads, threads_for
    from fedtune.engines.workers import prestart

    job = load_job(args.job, args.overrides)
    if args.threads is not None:  # every step's threads: this process, workers, subprocesses
        job = job.model_copy(
            update={"engine": job.engine.model_copy(update={"step_threads": args.threads})}
        )
        os.environ[THREADS_ENV] = str(args.threads)
    if args.log_format == "json":
        run_log.use_json_logs()
    resolve_device(job.training)  # before workers start or anything is stored
    if (args.engine or job.engine.name) == "local":
        # Worker processes start before this one imports the engine: their start-up overlaps.
        prestart(job, args.workers if args.workers is not None else job.engine.workers)
    elif (args.engine or job.engine.name) == "kfp-local":  # its tasks' fork server imports now
        from fedtune.engines import fork_server
        from fedtune.pipelines import kfp_tasks

        fork_server.start_early(kfp_tasks.PRELOAD)
    from fedtune.engines.local import RunOptions, default_summary_path, run_job
    from fedtune.engines.preflight import check_summary_path, check_workdir
    from fedtune.engines.stopping import graceful_stop

    # This process's steps (the provider's, and the tenants' without workers) use the CPUs
    # it may use, not the host's cores; workers take their share (WorkerPool).
    apply_threads(threads_for(job.engine.step_threads))
    check_workdir(job)
    path = Path(args.summary_json) if args.summary_json else default_summary_path(job)
    check_summary_path(path)
    engine = args.engine or job.engine.name
    console = run_log.summary_console()
    # Bars on a terminal; elsewhere (a pipe, a pod's log) one flushed line per event.
    bars = not args.no_progress and console.is_terminal and args.log_format == "text"
    events = None if bars else run_log.LineLog(args.log_format)
    options = RunOptions(
        resume=args.resume,
        fresh=args.fresh,
        until_round=args.until_round,
        progress=bars,
        workers=args.workers if args.workers is not None else job.engine.workers,
        events=events,
    )
    if engine == "kfp-local":
        from fedtune.cli.kfp_commands import run_kfp_local

        summary = run_kfp_local(job, options)
    else:
        try:
            with graceful_stop():  # the local engine stops at its next safe point
                summary = run_job(job, make_tracker(job), options)
        except StopRequested as exc:
            exc.fix = (
                f"Run `{run_log.continue_command(args)}` to continue; finished steps are kept."
            )
            raise
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True), encoding="utf-8")
    tmp.replace(path)
    partial = None if summary.get("completed", True) else run_log.continue_command(args)
    if args.log_format == "json":
        run_log.LineLog("json")({
            "event": "summary", "path": str(path), "completed": partial is None,
            "rounds_done": len(summary["rounds"]), "rounds": job.rounds,
            "artifacts": {n: a["uri"] for n, a in summary.get("artifacts", {}).items()},
            "mlflow_run_id": summary.get("mlflow_run_id"),
            **({"continue": partial} if partial else {}),
        })
        return 0
    _print_summary(summary, path, console)
    if partial:
        done = len(summary["rounds"])
        console.print(
            f"[yellow]partial run:[/] {done} of {job.rounds} rounds done (--until-round); "
            "the final evaluation, export and registration have not run. Continue with:",
        )
        console.print(escape(partial), soft_wrap=True)
    return 0


def _fmt(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else ("-" if value is None else str(value))


#: Tenants listed one per line in a round's bytes cell; more are summed into one line.
_BYTES_LINES = 8


def _bytes_cell(tenants: dict[str, dict[str, Any]]) -> str:
    """Bytes out / in of every tenant of a round, one line each (a total line for many)."""
    pairs = {n: (int(t.get("bytes_sent") or 0), int(t.get("bytes_received") or 0)) for n, t in tenants.items()}
    lines = [f"{n} {out:,}/{back:,}" for n, (out, back) in list(pairs.items())[:_BYTES_LINES]]
    if len(pairs) > _BYTES_LINES:
        rest = list(pairs.values())[_BYTES_LINES:]
        lines.append(
            f"{len(rest)} more {sum(p[0] for p in rest):,}/{sum(p[1] for p in rest):,}"
        )
    return escape("\n".join(lines))


def _print_summary(summary: dict[str, Any], path: Path, out: Console = out) -> None:
    table = Table(title=f"{summary['job']} ({summary['algorithm']})")
    for column in ("round", "tenants", "train loss", "eval loss", "bytes out/in", "seconds"):
        table.add_column(column, justify="right", no_wrap=column == "bytes out/in")
    for record in summary["rounds"]:
        table.add_row(
            str(record["round"]),
            f"{len(record['accepted'])}/{len(record['sampled'])}",
            _fmt(record["train_loss"]),
            _fmt(record["eval_loss"]),
            _bytes_cell(record["tenants"]),
            f"{record['wall_time']['total']:.1f}",
        )
    out.print(table)
    for name, artifact in summary.get("artifacts", {}).items():
        line = f"{name}: {artifact['uri']}"
        if artifact.get("registered_version"):  # 0: tracking is off, nothing was registered
            line += f"  (registered version {artifact['registered_version']})"
        out.print(line)
    if summary.get("audit"):
        pooled, tagged = summary["audit"]["pooled"], summary["audit"]["tagged"]
        where = ", ".join(f"{t['name']}/{t['version']}" for t in tagged) or "no registered version"
        out.print(
            f"memorization audit: mean Rouge-L {pooled['mean']:.4f} over {int(pooled['n'])} "
            f"records of {int(pooled['tenants'])} tenant(s), max {pooled['max']:.4f}, "
            f"{int(pooled['num_at_or_above'])} at or above {summary['audit']['threshold']:.2f} "
            f"(tagged: {where})"
        )
    if summary.get("privacy"):
        privacy = summary["privacy"]
        out.print(
            f"differential privacy: epsilon {privacy['epsilon']:.4g} at delta {privacy['delta']:g} "
            f"({privacy['adjacency']}, {privacy['accountant']})"
            + (f"; stopped before round {privacy['stopped_before_round']}: {privacy['reason']}"
               if privacy.get("stopped_before_round") else "")
        )
    for warning in summary.get("warnings", []):
        out.print(f"[yellow]warning:[/] {escape(warning)}")
    if summary.get("mlflow_run_id") not in (None, NullTracker.run_id):
        out.print(f"MLflow run: {summary['mlflow_run_id']}")
    out.print(f"summary: {path}")


def register_run(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run a job (in-process engine by default)",
        description="Run JOB.yaml: rounds of tenant training and aggregation, then export and "
        "register the final model. Finished steps are stored, so --resume continues a crashed "
        "run where it stopped.",
    )
    p.add_argument("job", help="path of the job YAML file")
    add_set_option(p)
    p.add_argument(
        "--engine",
        choices=["local", "kfp-local"],
        help="override the job's engine: local (in-process) or kfp-local (the compiled pipeline "
        "through kfp.local, the same components that run on the cluster)",
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true", help="continue a stored run")
    group.add_argument("--fresh", action="store_true", help="discard a stored run and start over")
    p.add_argument(
        "--until-round",
        type=positive_int,
        metavar="N",
        help="stop after round N: a partial run, without the final evaluation and export; "
        "it prints the command that continues it",
    )
    p.add_argument("--summary-json", metavar="PATH", help="write the run summary here")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bars: one line per tenant step and per round instead (what a run "
        "whose output is not a terminal writes anyway)",
    )
    p.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="text (bars on a terminal, else one line per event) or json: one JSON object "
        "per line on stdout, log records as JSON on stderr, for log collectors",
    )
    p.add_argument(
        "--workers",
        type=_workers,
        metavar="N|auto",
        help="local engine: run the sampled tenants' steps in N worker processes at once "
        "(auto: one per usable CPU, capped by memory), each with its share of the CPUs; "
        "results are bitwise equal to N=1 only with a fixed thread count (--threads or "
        "engine.step_threads), since float sums over different thread counts differ in the "
        "last bits (default: the job's engine.workers, else 1)",
    )
    p.add_argument(
        "--threads",
        type=_threads,
        metavar="N",
        help="torch threads of every step, overriding engine.step_threads (default: the "
        "CPUs this process may use, from its cgroup CPU quota and affinity mask, shared "
        "among the workers; $OMP_NUM_THREADS if set)",
    )
    p.set_defaults(handler=_run)


def _count(text: str, what: str, most: int, auto: bool = False) -> int:
    """``text`` as a number of ``what`` from 1 to ``most`` (argparse reports the error)."""
    alternative = ", or auto" if auto else ""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of {what}{alternative}"
        ) from None
    if not 1 <= value <= most:
        raise argparse.ArgumentTypeError(f"{value} {what}: use 1 to {most}{alternative}")
    return value


def _workers(text: str) -> int | str:
    return text if text == "auto" else _count(text, "workers", 256, auto=True)


def _threads(text: str) -> int:
    return _count(text, "threads", 1024)


# -- algorithms -----------------------------------------------------------------------------
def _algorithms(args: argparse.Namespace) -> int:
    from fedtune.core.catalog import algorithm_catalog  # reads the sources: no torch import

    for name, doc in algorithm_catalog().items():
        out.print(f"[bold]{name:12}[/] {doc}")
    return 0


def register_algorithms(sub: Any) -> None:
    p = sub.add_parser("algorithms", help="list the registered algorithms")
    p.set_defaults(handler=_algorithms)


def registrars() -> list[Registrar]:
    """Every subcommand's registrar, in the order --help lists them."""
    from fedtune.cli.audit import register_audit
    from fedtune.cli.bench import register_bench
    from fedtune.cli.evaluate import register_eval
    from fedtune.cli.identity import register_identity
    from fedtune.cli.kfp_commands import register_compile
    from fedtune.cli.partition import register_partition
    from fedtune.cli.serving import register_serving as register_promote_and_serve
    from fedtune.cli.submit import register_submit

    return [
        register_validate,
        register_run,
        register_partition,
        register_algorithms,
        register_compile,
        register_submit,
        register_promote_and_serve,
        register_eval,
        register_audit,
        register_identity,
        register_bench,
    ]
