"""Where each phase reads and writes: three store scopes and their keys.

One module owns the layout so the local engine, the KFP components and the tenant launcher
agree on it. Every key lives under ``jobs/<job-name>/`` of its store.

- **Provider-private** (``provider_store_uri``): server states, the provider's record of each
  round's broadcast, round summaries, the final evaluation, exports and audit results.
  Tenants never read it.
- **Exchange** (``exchange_uri``): one prefix per tenant, ``tenants/<name>/``, holding only
  what crosses the boundary for that tenant: each round's broadcast in and update out, and
  the final broadcast in and evaluation and audit scores out. A tenant step is handed a
  store confined to its own prefix (or pre-signed URLs for exactly those keys), so it cannot
  address another tenant's objects or anything of the provider's.
- **Tenant-private** (``tenants[].store_uri``): the tenant's kept client state and its full
  memorization-audit report (which records, what the model generated).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from fedtune.config.job import JobConfig, TenantConfig
from fedtune.config.tenant_view import TenantJob, tenant_view
from fedtune.storage import open_store
from fedtune.storage.base import Store
from fedtune.storage.s3 import S3Bounds

_ROUND = re.compile(r"round-(\d{6})")


def round_tag(round_index: int) -> str:
    """``round-000003``: fixed width so keys sort by round."""
    return f"round-{round_index:06d}"


# -- provider-private store ------------------------------------------------------------------
def state_key(round_index: int) -> str:
    """Server state after ``round_index`` (0 = initial state)."""
    return f"state/{round_tag(round_index)}"


def broadcast_key(round_index: int) -> str:
    """The provider's own record of what the tenants receive in ``round_index``."""
    return f"broadcast/{round_tag(round_index)}"


def final_broadcast_key(round_index: int) -> str:
    """The provider's record of the final broadcast after ``round_index`` rounds."""
    return f"broadcast/final-{round_tag(round_index)}"


def summary_key(round_index: int) -> str:
    """Metrics and timings of a completed round."""
    return f"summary/{round_tag(round_index)}.json"


def run_summary_key(rounds: int) -> str:
    """The whole summary of a run finished after ``rounds`` rounds (resume returns it)."""
    return f"summary/run-{round_tag(rounds)}.json"


RUN_KEY = "run.json"
FINAL_EVAL_KEY = "summary/final-eval.json"
AUDIT_KEY = "summary/audit-memorization.json"
"""The combined memorization audit: per-tenant scores, pooled numbers, tagged versions."""
ARTIFACTS_PREFIX = "artifacts"


# -- exchange store: keys inside one tenant's prefix ---------------------------------------------
def tenant_prefix(tenant: str) -> str:
    """A tenant's prefix of the exchange store; everything it may read or write is below."""
    return f"tenants/{tenant}"


def round_broadcast_key(round_index: int) -> str:
    """The round's broadcast, inside the tenant's exchange prefix."""
    return f"{round_tag(round_index)}/broadcast"


def update_key(round_index: int) -> str:
    """The tenant's update of ``round_index``, inside its exchange prefix."""
    return f"{round_tag(round_index)}/update"


def secagg_key(round_index: int, name: str) -> str:
    """A secure-aggregation message of the round (``advert``, ``roster``, ``dealt``, ``inbox``,
    ``unmask-request``, ``unmask``), inside the tenant's exchange prefix."""
    return f"{round_tag(round_index)}/secagg/{name}.json"


def privacy_plan_key(round_index: int) -> str:
    """The round's differential-privacy plan (clip norm, noise share), inside a tenant's
    exchange prefix."""
    return f"{round_tag(round_index)}/privacy.json"


def secagg_secrets_key(round_index: int) -> str:
    """A tenant's secure-aggregation keys, seed and held shares (in its own store)."""
    return f"secagg/{round_tag(round_index)}.json"


def final_tenant_broadcast_key(round_index: int) -> str:
    """The final model as tenants may see it, inside the tenant's exchange prefix."""
    return f"final-{round_tag(round_index)}/broadcast"


def final_eval_key(round_index: int) -> str:
    """The tenant's metrics of the final model, inside its exchange prefix."""
    return f"final-{round_tag(round_index)}/eval.json"


def final_audit_key(round_index: int) -> str:
    """The tenant's memorization-audit scores (numbers only), inside its exchange prefix."""
    return f"final-{round_tag(round_index)}/audit.json"


# -- tenant-private store -------------------------------------------------------------------
def client_state_key(round_index: int) -> str:
    """A tenant's kept state after ``round_index`` (in the tenant's own store)."""
    return f"client-state/{round_tag(round_index)}"


def final_client_state_key(round_index: int) -> str:
    """A tenant's kept state at the end of the last round (``Algorithm.finish_kept``), which
    its final steps score, export and audit (in the tenant's own store)."""
    return f"final-client-state/{round_tag(round_index)}"


def partial_step_key(round_index: int) -> str:
    """A client step's local training cut at a step boundary, for the worker that continues
    it (in the tenant's own store; removed once continued)."""
    return f"partial-step/{round_tag(round_index)}"


def audit_report_key(round_index: int) -> str:
    """The tenant's full audit (line numbers, scores, generations), in its own store."""
    return f"audit/memorization-{round_tag(round_index)}.json"


def latest_round(keys: list[str], before: int) -> int | None:
    """The highest round number in ``keys`` that is smaller than ``before``."""
    rounds = [int(m.group(1)) for k in keys if (m := _ROUND.search(k))]
    earlier = [r for r in rounds if r < before]
    return max(earlier) if earlier else None


@dataclass(frozen=True)
class JobStores:
    """The stores of one job, one accessor per scope."""

    job: JobConfig

    @property
    def workdir(self) -> Path:
        """The job's local work directory."""
        return Path(self.job.workdir)

    def _open(self, root: str) -> Store:
        """``root``'s folder of this job, its S3 requests bounded by the job's limits."""
        return open_store(root, bounds=S3Bounds.of(self.job.limits)).child(f"jobs/{self.job.name}")

    def provider(self) -> Store:
        """The provider-private store of this job."""
        root = self.job.provider_store_uri or str(self.workdir / "provider")
        return self._open(root)

    def exchange_root(self) -> Store:
        """The whole exchange of this job (the provider's view: every tenant's prefix)."""
        root = self.job.exchange_uri or str(self.workdir / "exchange")
        return self._open(root)

    def exchange(self, tenant: str) -> Store:
        """One tenant's exchange prefix, confined: keys outside it are refused."""
        return self.exchange_root().child(tenant_prefix(tenant))

    def tenant(self, tenant: TenantConfig) -> Store:
        """The tenant's private store (client state), confined to this job."""
        root = tenant.store_uri or str(self.workdir / "tenants" / tenant.name)
        return self._open(root)


def view_for(job: JobConfig, tenant: str) -> TenantJob:
    """The provider builds ``tenant``'s view of ``job``, with its exchange prefix in this
    layout (what in-process engines and worker processes hand the tenant's steps).

    Raises:
        ConfigError: No tenant of that name.
    """
    view = tenant_view(job, tenant)  # checks the name before any store is opened
    return view.model_copy(update={"exchange_uri": JobStores(job).exchange(tenant).uri})
