"""Provider, start of a round: write the round's broadcast from the previous server state.

``python -m fedtune.entrypoints.configure_round --job JOB.yaml --round N``

In a pipeline the round loop's iteration only proposes a round (its *slot*): the step trains
the first round whose state and record are not stored yet. KFP runs the loop with
``parallelism=1`` but does not promise the iterations' order, so this keeps rounds in order
whatever order they run in, and a resumed run picks up where the stored state ends.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence
from typing import Any

from fedtune.config.job import JobConfig
from fedtune.engines import layout, retention, steps
from fedtune.entrypoints import common

log = logging.getLogger(__name__)


def run(job: JobConfig, round_index: int) -> dict[str, Any]:
    """Write round ``round_index``'s broadcast (skipped when stored); return its marker."""
    started_at = time.time()
    env = steps.ProviderEnv.create(job)
    dp = job.differential_privacy is not None and not retention.round_recorded(env.store(), round_index)
    if dp:  # as the local engine: stop before a round that would exceed the budget
        from fedtune.engines import privacy_steps  # torch: only for DP jobs

        privacy_steps.check_budget(env, round_index)
    result = steps.configure_step(env, round_index)
    sampled = steps.sample_clients(job, round_index)
    if dp:  # the round's clip norm and noise share, to each sampled tenant
        privacy_steps.publish_plan(env, round_index, sampled)
    # started_at lets the aggregate step report the round's wall time across pods.
    return {"round": round_index, "started_at": started_at, "configure": result, "sampled": sampled}


def next_round(job: JobConfig, slot: int) -> int:
    """The first round not completed in the provider store (``slot`` when all are)."""
    store = layout.JobStores(job).provider()
    for round_index in range(1, job.rounds + 1):
        if not retention.round_recorded(store, round_index):
            return round_index
    return min(int(slot), job.rounds)


def component(job_path: str, slot: int, broadcast_path: str) -> list[str]:
    """Body of the ``configure-round`` KFP component: the round's sampled tenants."""

    def body() -> list[str]:
        job = common.read_job_artifact(job_path)
        round_index = next_round(job, int(slot))
        if round_index != int(slot):
            log.warning("loop slot %s runs round %d (the first one not stored)", slot, round_index)
        marker = run(job, round_index)
        common.write_marker(broadcast_path, marker)
        return list(marker["sampled"])

    common.setup_logging()
    return common.guarded(body)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = common.job_parser(__doc__.splitlines()[0], "configure_round")
    parser.add_argument("--round", type=int, required=True, help="round number (from 1)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line of the step."""
    common.run_main(_parse, lambda a: run(common.read_job(a.job, a.job_json), a.round), argv)


if __name__ == "__main__":
    main()
