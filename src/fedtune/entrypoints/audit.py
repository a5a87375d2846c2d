"""Tenant, after export: memorization audit of the final model on its own training records.

``python -m fedtune.entrypoints.audit --job JOB.yaml --tenant NAME`` runs it in this process;
a launched tenant pod adds ``--presigned``. Only the scores (mean, quantiles, count at or
above the threshold, records audited) go to the provider; line numbers and generations stay
in the tenant's private store (:func:`fedtune.engines.tenant.audit.audit_step`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fedtune.config.job import JobConfig
from fedtune.entrypoints import common, final_step


def run(job: JobConfig, tenant: str, run_key: str = "") -> dict[str, Any]:
    """Audit the final model on the tenant's data (launched or in-process); return a marker."""
    return final_step.run(job, "audit", tenant, run_key)


def component(job_path: str, tenant: str, run_key: str, scores_path: str) -> None:
    """Body of the ``audit`` KFP component."""
    final_step.component("audit", job_path, tenant, run_key, scores_path)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line of the step."""
    common.run_main(
        lambda a: final_step.parse("audit", __doc__.splitlines()[0], a),
        lambda args: final_step.body("audit", args),
        argv,
    )


if __name__ == "__main__":
    main()
