"""Tenant, after the last round: metrics of the final model on the tenant's held-out split.

``python -m fedtune.entrypoints.evaluate --job JOB.yaml --tenant NAME`` runs it in this
process; a launched tenant pod adds ``--presigned`` (see :mod:`fedtune.engines.tenant.pod_io`).
The KFP component calls :func:`run`, which goes through the tenant launcher.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fedtune.config.job import JobConfig
from fedtune.entrypoints import common, final_step


def run(job: JobConfig, tenant: str, run_key: str = "") -> dict[str, Any]:
    """Evaluate the final model on the tenant's data (launched or in-process); return a marker."""
    return final_step.run(job, "evaluate", tenant, run_key)


def component(
    job_path: str,
    tenant: str,
    run_key: str,
    metrics_path: str,
    metrics: common.MetricsSink | None = None,
) -> None:
    """Body of the ``evaluate`` KFP component."""
    final_step.component("evaluate", job_path, tenant, run_key, metrics_path, metrics)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line of the step."""
    common.run_main(
        lambda a: final_step.parse("evaluate", __doc__.splitlines()[0], a),
        lambda args: final_step.body("evaluate", args),
        argv,
    )


if __name__ == "__main__":
    main()
