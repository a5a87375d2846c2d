"""Tenant, after the last round: metrics of the final model on the tenant's held-out split.

``python -m fedtune.entrypoints.evaluate --job JOB.yaml --tenant NAME`` runs it in this
process; a launched tenant pod adds ``--presigned`` (see :mod:`fedtune.entrypoints.tenant_io`).
The KFP component calls :func:`run`, which goes through the tenant launcher.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from fedtune.config.job import JobConfig
from fedtune.engines import steps
from fedtune.entrypoints import common, tenant_io


def run(job: JobConfig, tenant: str, run_key: str = "") -> dict[str, Any]:
    """Evaluate the final model on the tenant's data (launched or in-process); return a marker."""
    from fedtune.engines.launcher import run_tenant_step

    result = run_tenant_step(job, "evaluate", job.rounds, tenant, run_key=run_key)
    return {"tenant": tenant, "metrics": result["metrics"]}


def component(job_path: str, tenant: str, run_key: str, metrics_path: str) -> None:
    """Body of the ``evaluate`` KFP component."""
    common.setup_logging()
    common.guarded(
        lambda: common.write_marker(
            metrics_path, run(common.read_job_artifact(job_path), tenant, run_key)
        )
    )


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = common.job_parser(__doc__.splitlines()[0], "evaluate")
    parser.add_argument("--tenant", required=True, help="tenant name")
    parser.add_argument(
        "--round", type=int, help="accepted for symmetry with client_step; the final round is used"
    )
    parser.add_argument(
        "--presigned",
        action="store_true",
        help=f"reach the exchange only through the URLs in ${tenant_io.PRESIGNED_ENV}",
    )
    return parser.parse_args(argv)


def _body(args: argparse.Namespace) -> dict[str, Any]:
    job = common.read_job(args.job, args.job_json)
    if args.presigned:
        expected = tenant_io.step_objects("evaluate", job, job.rounds, args.tenant)
        urls = tenant_io.read_urls(expected)
        return tenant_io.run_presigned(job, "evaluate", job.rounds, args.tenant, urls)
    return {"metrics": steps.evaluate_step(steps.TenantEnv.create(job, args.tenant))}


def main(argv: Sequence[str] | None = None) -> None:
    """Command line of the step."""
    common.run_main(_parse, _body, argv)


if __name__ == "__main__":
    main()
