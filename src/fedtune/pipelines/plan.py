"""The shape of one pipeline run: which rounds, which tenants per round, and its size bound.

Rounds are unrolled at compile time and each round's sampled tenants become a static
``ParallelFor`` list, so a compiled pipeline only fits the job it was compiled from. The plan
records that shape; the server-init step checks the job it is given at run time against it
(the job-config parameter can be edited in the KFP UI) and refuses edits the compiled graph
cannot follow.

Size bound. The KFP backend keeps a whole run as one workflow object, which etcd caps at
about 1.5 MiB, and turns every task into two pods; a public report shows a ~56-task pipeline
failing on that limit. We count every node the workflow holds (each component task, each round
sub-pipeline, each loop and each loop iteration) and refuse more than :data:`MAX_TASKS` per
run. Longer trainings run as chained runs (``--start-round``/``--rounds``) that resume from the
state the previous run stored.

This module does not import kfp: pods read plans without paying for it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from fedtune.config.job import JobConfig
from fedtune.core.errors import ConfigError
from fedtune.engines.steps import sample_clients

MAX_TASKS = 50
"""Most workflow nodes one compiled run may hold (see the module docstring)."""


@dataclass(frozen=True)
class PipelinePlan:
    """Rounds ``start_round..end_round`` of a job, each with its sampled tenants."""

    job: str
    algorithm: str
    start_round: int
    end_round: int
    total_rounds: int
    rounds: tuple[tuple[int, tuple[str, ...]], ...]
    tenants: tuple[str, ...]
    audited: tuple[str, ...] = ()  # tenants of the memorization audit after export

    @property
    def final(self) -> bool:
        """Whether this run ends the job (and so evaluates, exports and registers)."""
        return self.end_round == self.total_rounds

    def task_count(self) -> int:
        """Workflow nodes of the run: see the module docstring for what counts."""
        count = 1  # server init
        for _, sampled in self.rounds:
            # round sub-pipeline + configure + loop + (iteration + client) per tenant + aggregate
            count += 4 + 2 * len(sampled)
        if self.final:
            count += 2 + 2 * len(self.tenants)  # loop + (iteration + evaluate) each + export
            if self.audited:
                count += 2 + 2 * len(self.audited)  # loop + (iteration + audit) each + record
        return count

    def to_json(self) -> str:
        """Compact JSON, passed to the server-init task as a constant."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> PipelinePlan:
        """Inverse of :meth:`to_json`."""
        raw: dict[str, Any] = json.loads(text)
        raw["rounds"] = tuple((int(r), tuple(names)) for r, names in raw["rounds"])
        raw["tenants"] = tuple(raw["tenants"])
        raw["audited"] = tuple(raw.get("audited", ()))
        return cls(**raw)

    def mismatches(self, job: JobConfig) -> list[str]:
        """How ``job`` differs from the shape this plan was compiled for (empty: it fits)."""
        problems = []
        names = tuple(sorted(t.name for t in job.tenants))
        if names != self.tenants:
            problems.append(f"tenants are {list(names)}, compiled for {list(self.tenants)}")
        audited = tuple(job.audited_tenants)
        if self.final and audited != self.audited:
            problems.append(
                f"the memorization audit covers {list(audited)}, compiled for "
                f"{list(self.audited)} (audit.enabled or audit.tenants changed)"
            )
        if job.rounds != self.total_rounds:
            problems.append(f"rounds is {job.rounds}, compiled for {self.total_rounds}")
        for round_index, sampled in self.rounds:
            now = tuple(sample_clients(job, round_index))
            if now != sampled:
                problems.append(
                    f"round {round_index} samples {list(now)}, compiled for {list(sampled)} "
                    "(seed or clients_per_round changed)"
                )
        return problems


def plan_job(job: JobConfig, start_round: int = 1, rounds: int | None = None) -> PipelinePlan:
    """The plan of rounds ``start_round .. start_round + rounds - 1`` (default: to the end).

    Raises:
        ConfigError: The range lies outside ``1..job.rounds``.
    """
    if not 1 <= start_round <= job.rounds:
        raise ConfigError(
            f"--start-round {start_round} is outside the job's rounds 1..{job.rounds}",
            fix=f"Pick a start round between 1 and {job.rounds}.",
        )
    remaining = job.rounds - start_round + 1
    count = remaining if rounds is None else rounds
    if not 1 <= count <= remaining:
        raise ConfigError(
            f"--rounds {count} from round {start_round} does not fit the job's {job.rounds} rounds",
            fix=f"Pick --rounds between 1 and {remaining}.",
        )
    end = start_round + count - 1
    return PipelinePlan(
        job=job.name,
        algorithm=job.algorithm.name,
        start_round=start_round,
        end_round=end,
        total_rounds=job.rounds,
        rounds=tuple((r, tuple(sample_clients(job, r))) for r in range(start_round, end + 1)),
        tenants=tuple(sorted(t.name for t in job.tenants)),
        audited=tuple(job.audited_tenants) if end == job.rounds else (),
    )


def check_size(plan: PipelinePlan, job: JobConfig) -> None:
    """Refuse a plan above :data:`MAX_TASKS`, saying how to split it into chained runs.

    Raises:
        ConfigError: The run would hold more workflow nodes than the bound allows.
    """
    size = plan.task_count()
    if size <= MAX_TASKS:
        return
    fitting = 0
    for count in range(1, plan.end_round - plan.start_round + 2):
        if plan_job(job, plan.start_round, count).task_count() > MAX_TASKS:
            break
        fitting = count
    where = f"rounds {plan.start_round}-{plan.end_round} with {len(plan.tenants)} tenants"
    if fitting == 0:
        fix = (
            "Even one round does not fit: lower clients_per_round (each sampled tenant adds "
            "two nodes per round) or split the tenants into separate jobs."
        )
    else:
        nxt = plan.start_round + fitting
        fix = (
            f"Split it into chained runs of at most {fitting} round(s): `fedtune compile JOB.yaml "
            f"--start-round {plan.start_round} --rounds {fitting}`, then `--start-round {nxt}` "
            "and so on; each run resumes from the server state the previous one stored."
        )
    raise ConfigError(
        f"job {job.name!r} unrolls to {size} pipeline tasks ({where}), above the bound of "
        f"{MAX_TASKS} per run (the KFP backend stores a run as one object of at most ~1.5 MiB)",
        fix=fix,
    )
