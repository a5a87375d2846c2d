"""Provider, after the tenants' audits: pool their scores, tag the registered versions, log.

``python -m fedtune.entrypoints.record_audit --job JOB.yaml``

Reads every audited tenant's scores from its exchange prefix (never the markers, which only
order the tasks), the registered versions from ``summary/artifacts.json`` in the provider
store, and runs :func:`fedtune.engines.provider.audit.record_audit` in the run's tracker.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from fedtune.config.job import JobConfig
from fedtune.engines import steps
from fedtune.engines.provider.audit import record_audit
from fedtune.entrypoints import common
from fedtune.entrypoints.export_and_register import ARTIFACTS_KEY


def run(job: JobConfig) -> dict[str, Any]:
    """Pool, tag, log and store the audit; return the stored record."""
    env = steps.ProviderEnv.create(job)
    store = env.store()
    artifacts = store.get_json(ARTIFACTS_KEY) if store.exists(ARTIFACTS_KEY) else {}
    tracker = common.resume_tracker(job, store)
    try:
        record = record_audit(env, tracker, artifacts)
        tracker.end("FINISHED")
    except BaseException:
        tracker.end("FAILED")
        raise
    return {"audit": record}


def component(job_path: str, scores_paths: list[str], audit_path: str) -> None:
    """Body of the ``record-audit`` KFP component (the score markers only order it)."""
    common.setup_logging()
    common.guarded(
        lambda: common.write_marker(audit_path, run(common.read_job_artifact(job_path)))
    )


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    return common.job_parser(__doc__.splitlines()[0], "record_audit").parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line of the step."""
    common.run_main(_parse, lambda args: run(common.read_job(args.job, args.job_json)), argv)


if __name__ == "__main__":
    main()
