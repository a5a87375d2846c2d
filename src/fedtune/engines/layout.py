"""Where each phase reads and writes: the keys of the exchange store and tenant stores.

One module owns the layout so the local engine, the KFP components and the tenant launcher
agree on it. Every key lives under ``jobs/<job-name>/`` of its store.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from fedtune.config.job import JobConfig, TenantConfig
from fedtune.storage import open_store
from fedtune.storage.base import Store

_ROUND = re.compile(r"round-(\d{6})")


def round_tag(round_index: int) -> str:
    """``round-000003``: fixed width so keys sort by round."""
    return f"round-{round_index:06d}"


def state_key(round_index: int) -> str:
    """Server state after ``round_index`` (0 = initial state)."""
    return f"state/{round_tag(round_index)}"


def broadcast_key(round_index: int) -> str:
    """What the tenants receive in ``round_index``."""
    return f"broadcast/{round_tag(round_index)}"


def update_key(round_index: int, tenant: str) -> str:
    """One tenant's update in ``round_index``."""
    return f"updates/{round_tag(round_index)}/{tenant}"


def summary_key(round_index: int) -> str:
    """Metrics and timings of a completed round."""
    return f"summary/{round_tag(round_index)}.json"


def client_state_key(round_index: int) -> str:
    """A tenant's kept state after ``round_index`` (in the tenant's own store)."""
    return f"client-state/{round_tag(round_index)}"


RUN_KEY = "run.json"
FINAL_EVAL_KEY = "summary/final-eval.json"


def latest_round(keys: list[str], before: int) -> int | None:
    """The highest round number in ``keys`` that is smaller than ``before``."""
    rounds = [int(m.group(1)) for k in keys if (m := _ROUND.search(k))]
    earlier = [r for r in rounds if r < before]
    return max(earlier) if earlier else None


@dataclass(frozen=True)
class JobStores:
    """The stores of one job: the exchange store and a resolver for tenants' own stores."""

    job: JobConfig

    @property
    def workdir(self) -> Path:
        """The job's local work directory."""
        return Path(self.job.workdir)

    def exchange(self) -> Store:
        """Provider <-> tenant messages of this job."""
        root = self.job.exchange_uri or str(self.workdir / "exchange")
        return open_store(root).child(f"jobs/{self.job.name}")

    def tenant(self, tenant: TenantConfig) -> Store:
        """The tenant's private store (client state), confined to this job."""
        root = tenant.store_uri or str(self.workdir / "tenants" / tenant.name)
        return open_store(root).child(f"jobs/{self.job.name}")
