"""What one tenant receives of a job: the tenant view, built by allowlist.

The provider holds the whole :class:`~fedtune.config.job.JobConfig`; a tenant's code, its
launched pods and the local engine's worker processes get a :class:`TenantJob` instead. It
is constructed field by field from what tenant phases read (never by deleting fields from
the job), so a field added to the job stays with the provider until someone adds it here:

- the run key (the job's name, which prefixes every store key), the seed and the rounds;
- this tenant's own entry (``tenants[i]``), the ``training``, ``lora`` and ``limits``
  sections;
- the algorithm's *tenant part* (``AlgorithmSection.TenantPart``: FedPT's large model, for
  one, is not in it);
- the base tenants may build (a tiny config or ``model.tenant_uri``, and its tokenizer),
  only for algorithms whose tenants build one; the public set only where the algorithm
  shares it with every party (FedMKT);
- this tenant's exchange prefix (None in a launched pod, which gets pre-signed URLs);
- the protocol facts a tenant checks itself: secure aggregation's settings and the
  registered identities it verifies, whether client-level DP clips its update, its audit.

Nothing of the provider's model (``model.uri``), stores, tracking or resources, and nothing
of other tenants (beyond the names and public keys secure aggregation verifies).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from fedtune.config.algorithms import AlgorithmTenantPart
from fedtune.config.base import Dns1123Label, StrictModel
from fedtune.config.job import (
    JobConfig,
    LimitsConfig,
    LoraConfig,
    SecureAggregationConfig,
    TenantConfig,
    TrainingConfig,
)
from fedtune.config.models import PretrainedModelConfig, TinyModelConfig
from fedtune.core.errors import ConfigError


class TenantAudit(StrictModel):
    """The memorization audit as an audited tenant runs it (absent for other tenants)."""

    records: int = Field(ge=1, description="Training records audited.")
    threshold: float = Field(ge=0.0, le=1.0, description="Rouge-L that counts as reproduced.")
    max_new_tokens: int = Field(ge=1, description="Most tokens generated per audited prompt.")


class TenantSecureAggregation(StrictModel):
    """What a tenant derives a secure-aggregation round from by itself, so the provider
    cannot choose it: the settings, the sampling and every party's registered public key."""

    settings: SecureAggregationConfig = Field(description="The job's secure_aggregation.")
    clients_per_round: int = Field(ge=1, description="Tenants sampled per round.")
    identities: dict[Dns1123Label, str | None] = Field(
        description="Every tenant's registered Ed25519 public key (hex; None: not registered)."
    )

    @property
    def names(self) -> list[str]:
        """Every tenant of the job, sorted (what the round's sample is drawn from)."""
        return sorted(self.identities)


class TenantJob(StrictModel):
    """The only job object tenant code receives (see the module docstring)."""

    job_name: Dns1123Label = Field(description="The run key: prefixes every store key.")
    seed: int = Field(ge=0, description="The job seed (splits, sampling, training).")
    rounds: int = Field(ge=1, description="Rounds of the run (the final step's keys).")
    tenant: TenantConfig = Field(description="This tenant's own entry of the job.")
    training: TrainingConfig
    lora: LoraConfig
    limits: LimitsConfig
    algorithm: AlgorithmTenantPart = Field(description="The algorithm's tenant part.")
    base_model: TinyModelConfig | str | None = Field(
        None,
        description="The base tenants build (a tiny config or model.tenant_uri); None: "
        "every weight comes in the broadcast.",
    )
    tokenizer: str = Field("auto", min_length=1, description="The base's tokenizer spec.")
    public_data_uri: str | None = Field(
        None, description="The public set, where the algorithm shares it with tenants."
    )
    exchange_uri: str | None = Field(
        None, description="This tenant's exchange prefix (None: a pod with pre-signed URLs)."
    )
    store_uri: str = Field(min_length=1, description="The root of this tenant's own store.")
    client_level_dp: bool = Field(
        False, description="Client-level DP: the tenant clips (and noises) each update."
    )
    secure_aggregation: TenantSecureAggregation | None = None
    audit: TenantAudit | None = None

    @property
    def name(self) -> str:
        """This tenant's name."""
        return self.tenant.name

    def without_exchange(self) -> TenantJob:
        """The view a launched pod gets: no exchange prefix (it has pre-signed URLs)."""
        return self.model_copy(update={"exchange_uri": None})


def secure_aggregation_facts(job: JobConfig) -> TenantSecureAggregation:
    """What every party of a secure-aggregation round derives the round from (the provider
    and each tenant alike)."""
    return TenantSecureAggregation(
        settings=job.secure_aggregation,
        clients_per_round=job.sampled_per_round,
        identities={t.name: t.identity_key for t in job.tenants},
    )


def tenant_view(job: JobConfig, tenant: str, *, exchange_uri: str | None = None) -> TenantJob:
    """The view of ``tenant``, constructed from the job by allowlist.

    Args:
        job: The provider's job.
        tenant: The tenant's name.
        exchange_uri: The URI of the tenant's exchange prefix (the provider's store layout
            decides it; None for a launched pod).

    Raises:
        ConfigError: No tenant of the job has that name.
    """
    entry = next((t for t in job.tenants if t.name == tenant), None)
    if entry is None:
        raise ConfigError(
            f"no tenant named {tenant!r} in job {job.name!r}",
            fix=f"Use one of {sorted(t.name for t in job.tenants)}.",
        )
    section = type(job.algorithm)
    base: TinyModelConfig | str | None = None
    if section.capabilities.tenants_load_base:
        model = job.model
        base = model.tenant_uri if isinstance(model, PretrainedModelConfig) else model
    audited = tenant in job.audited_tenants
    return TenantJob(
        job_name=job.name,
        seed=job.seed,
        rounds=job.rounds,
        tenant=entry,
        training=job.training,
        lora=job.lora,
        limits=job.limits,
        algorithm=job.algorithm.tenant_part(),
        base_model=base,
        tokenizer=job.tokenizer if base is not None else "auto",
        public_data_uri=job.public_data_uri if section.capabilities.tenants_read_public else None,
        exchange_uri=exchange_uri,
        # The tenant's own store: its store_uri, else its folder under the work directory
        # (local runs), resolved where the tenant runs, as before.
        store_uri=entry.store_uri or str(Path(job.workdir) / "tenants" / entry.name),
        client_level_dp=job.differential_privacy is not None,
        secure_aggregation=secure_aggregation_facts(job) if job.secure_aggregation.enabled else None,
        audit=(
            TenantAudit(
                records=job.audit.records,
                threshold=job.audit.threshold,
                max_new_tokens=job.audit.max_new_tokens,
            )
            if audited
            else None
        ),
    )
