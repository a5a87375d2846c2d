"""Tenant, each round: train on the tenant's own data and deliver its update.

``python -m fedtune.entrypoints.client_step --job JOB.yaml --round N --tenant NAME``
runs the step in this process. A launched tenant pod adds ``--presigned`` and gets its job
from ``$FEDTUNE_JOB_JSON`` and its exchange objects as pre-signed URLs (see
:mod:`fedtune.engines.tenant.pod_io`). The KFP component calls :func:`run`, which goes through
the tenant launcher (a Job in the tenant's namespace when inside a cluster).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from typing import Any

from fedtune.config.job import JobConfig
from fedtune.core.errors import FedtuneError
from fedtune.engines import steps
from fedtune.engines.tenant import pod_io
from fedtune.engines.tenant.pod_io import StepKind
from fedtune.engines.tenant.tasks import run_tenant_task
from fedtune.entrypoints import common

log = logging.getLogger(__name__)


def run(
    job: JobConfig, round_index: int, tenant: str, run_key: str = "", kind: StepKind = "client"
) -> dict[str, Any]:
    """Run the tenant's step (launched or in-process); return its marker. ``kind`` is
    ``client`` or one of a secure-aggregation round's extra tenant steps.

    A :class:`FedtuneError` does not fail the task: as in the local engine, a tenant's failure
    costs its update, not the round, and the aggregate step's quorum decides. Anything else
    (an API server hiccup, a killed pod) fails the task so that KFP retries it.
    """
    from fedtune.engines.launcher import run_tenant_step

    marker: dict[str, Any] = {"round": round_index, "tenant": tenant, "kind": kind}
    try:
        result = run_tenant_step(job, kind, round_index, tenant, run_key=run_key)
    except FedtuneError as exc:
        # The marker reaches the aggregate step and the KFP UI: only the redacted failure.
        failure = exc.redacted().render()
        log.error("%s step of tenant %s failed: %s", kind, tenant, failure)
        return {**marker, "ok": False, "reason": f"{kind} step failed: {failure}"}
    return {**marker, "ok": True, "result": result}


def component(job_path: str, broadcast_path: str, tenant: str, run_key: str, update_path: str) -> None:
    """Body of the ``client-step`` KFP component (the round is the broadcast's)."""

    def body() -> None:
        round_index = int(common.read_marker(broadcast_path)["round"])
        job = common.read_job_artifact(job_path)
        common.write_marker(update_path, run(job, round_index, tenant, run_key))

    common.setup_logging()
    common.guarded(body)


def parse(argv: Sequence[str] | None, description: str, step: str) -> argparse.Namespace:
    """The command line of a tenant step of a round (this one, or a secure-aggregation step)."""
    parser = common.job_parser(description, step)
    parser.add_argument("--round", type=int, required=True, help="round number (from 1)")
    parser.add_argument("--tenant", required=True, help="tenant name")
    parser.add_argument(
        "--presigned",
        action="store_true",
        help=f"reach the exchange only through the URLs in ${pod_io.PRESIGNED_ENV}",
    )
    return parser.parse_args(argv)


def body(args: argparse.Namespace, kind: StepKind = "client") -> dict[str, Any]:
    """Run a tenant step of a round here: through pre-signed URLs in a launched pod, else on
    the job's stores."""
    if args.presigned:  # a launched pod: its view of the job, never the job
        view = common.tenant_view_for(args)
        urls = pod_io.read_urls(pod_io.step_objects(kind, view, args.round))
        return pod_io.run_presigned(view, kind, args.round, urls)
    job = common.read_job(args.job, args.job_json)
    # Never the launcher here: this process may itself be the launched pod.
    return run_tenant_task(steps.TenantEnv.create(job, args.tenant), kind, args.round)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line of the step."""
    common.run_main(lambda a: parse(a, __doc__.splitlines()[0], "client_step"), body, argv)


if __name__ == "__main__":
    main()
