"""Provider, once after the last round: publish the final broadcast to every tenant.

``python -m fedtune.entrypoints.final_broadcast --job JOB.yaml``

What tenants may see of the final model (the algorithm's ``final_broadcast``, computed with
the provider's model) is recorded in the provider's store and copied into each tenant's
exchange prefix, by this one provider task, before the tenants' evaluate tasks start: they
only read it, so no two tasks write the same files and no tenant task does provider work.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from fedtune.config.job import JobConfig
from fedtune.entrypoints import common


def run(job: JobConfig) -> dict[str, Any]:
    """Publish the final broadcast to every tenant (skipped where present); return a marker."""
    from fedtune.engines import steps

    out = steps.final_broadcast_step(steps.ProviderEnv.create(job))
    return {"round": job.rounds, **out}


def component(job_path: str, state_path: str, out_path: str) -> None:
    """Body of the ``final-broadcast`` KFP component (``state_path``: close-rounds' marker,
    which only orders the task)."""

    def body() -> None:
        common.write_marker(out_path, run(common.read_job_artifact(job_path)))

    common.setup_logging()
    common.guarded(body)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    return common.job_parser(__doc__.splitlines()[0], "final_broadcast").parse_args(argv)


def _body(args: argparse.Namespace) -> dict[str, Any]:
    return run(common.read_job(args.job, args.job_json))


def main(argv: Sequence[str] | None = None) -> None:
    """Command line of the step."""
    common.run_main(_parse, _body, argv)


if __name__ == "__main__":
    main()
