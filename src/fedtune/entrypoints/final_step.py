"""What the after-training tenant steps (evaluate, audit) share: launch, parse, run.

Both read the final broadcast from the tenant's exchange prefix and write one JSON result
back; in a cluster both run as a Job in the tenant's namespace through the tenant launcher,
with ``--round N --tenant NAME --presigned`` exactly as the admission policy admits.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from fedtune.config.job import JobConfig
from fedtune.engines import steps
from fedtune.engines.tenant import pod_io
from fedtune.engines.tenant.tasks import TenantKind, run_tenant_task
from fedtune.entrypoints import common

RESULT_FIELD: dict[str, str] = {"evaluate": "metrics", "audit": "scores"}
"""The field of each step's result (and marker) that carries what it produced."""


def run(job: JobConfig, kind: TenantKind, tenant: str, run_key: str = "") -> dict[str, Any]:
    """Run the step for ``tenant`` (launched or in-process); return its marker."""
    from fedtune.engines.launcher import run_tenant_step

    field = RESULT_FIELD[kind]
    result = run_tenant_step(job, kind, job.rounds, tenant, run_key=run_key)
    return {"tenant": tenant, field: result[field]}


def component(
    kind: TenantKind,
    job_path: str,
    tenant: str,
    run_key: str,
    out_path: str,
    metrics: common.MetricsSink | None = None,
) -> None:
    """Body of the step's KFP component; its numbers also go to ``metrics`` when given."""

    def body() -> None:
        marker = run(common.read_job_artifact(job_path), kind, tenant, run_key)
        common.write_marker(out_path, marker)
        common.log_metrics(metrics, dict(marker[RESULT_FIELD[kind]]))

    common.setup_logging()
    common.guarded(body)


def parse(kind: TenantKind, description: str, argv: Sequence[str] | None) -> argparse.Namespace:
    """The step's command line."""
    parser = common.job_parser(description, kind)
    parser.add_argument("--tenant", required=True, help="tenant name")
    parser.add_argument(
        "--round", type=int, help="accepted for symmetry with client_step; the final round is used"
    )
    parser.add_argument(
        "--presigned",
        action="store_true",
        help=f"reach the exchange only through the URLs in ${pod_io.PRESIGNED_ENV}",
    )
    return parser.parse_args(argv)


def body(kind: TenantKind, args: argparse.Namespace) -> dict[str, Any]:
    """Run the step here: through pre-signed URLs in a launched pod, else on the job's stores."""
    if args.presigned:  # a launched pod: its view of the job, never the job
        view = common.tenant_view_for(args)
        urls = pod_io.read_urls(pod_io.step_objects(kind, view, view.rounds))
        return pod_io.run_presigned(view, kind, view.rounds, urls)
    job = common.read_job(args.job, args.job_json)
    return run_tenant_task(steps.TenantEnv.create(job, args.tenant), kind, job.rounds)
