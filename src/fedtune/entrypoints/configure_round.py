"""Provider, start of a round: write the round's broadcast from the previous server state.

``python -m fedtune.entrypoints.configure_round --job JOB.yaml --round N``
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

from fedtune.config.job import JobConfig
from fedtune.engines import steps
from fedtune.entrypoints import common


def run(job: JobConfig, round_index: int) -> dict[str, Any]:
    """Write round ``round_index``'s broadcast (skipped when stored); return its marker."""
    started_at = time.time()
    result = steps.configure_step(steps.ProviderEnv.create(job), round_index)
    # started_at lets the aggregate step report the round's wall time across pods.
    return {"round": round_index, "started_at": started_at, "configure": result}


def component(job_path: str, round_index: int, broadcast_path: str) -> None:
    """Body of the ``configure-round`` KFP component."""
    common.setup_logging()
    common.guarded(
        lambda: common.write_marker(
            broadcast_path, run(common.read_job_artifact(job_path), int(round_index))
        )
    )


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = common.job_parser(__doc__.splitlines()[0], "configure_round")
    parser.add_argument("--round", type=int, required=True, help="round number (from 1)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line of the step."""
    common.run_main(_parse, lambda a: run(common.read_job(a.job, a.job_json), a.round), argv)


if __name__ == "__main__":
    main()
