"""The root :class:`JobConfig` and its sections (model, training, LoRA, tenants, tracking)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from fedtune.config.algorithms import AlgorithmConfig, summed_update_algorithms
from fedtune.config.base import Dns1123Label, StoreUri, StrictModel
from fedtune.config.dp_sgd import DpSgdConfig, dp_sgd_problem
from fedtune.config.models import PretrainedModelConfig, TinyModelConfig
from fedtune.config.privacy import DifferentialPrivacyConfig

ModelConfig = Annotated[TinyModelConfig | PretrainedModelConfig, Field(discriminator="source")]


class TrainingConfig(StrictModel):
    """Local training on each tenant, per round."""

    local_steps: int | None = Field(
        10, ge=1, le=100_000, description="Optimizer steps per round (exclusive with local_epochs)."
    )
    local_epochs: int | None = Field(
        None, ge=1, le=1000, description="Passes over the tenant's data per round."
    )
    batch_size: int = Field(8, ge=1, le=4096, description="Examples per step.")
    lr: float = Field(1e-3, gt=0.0, le=10.0, description="Client learning rate.")
    optimizer: Literal["sgd", "adamw"] = Field("adamw", description="Client optimizer.")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW weight decay.")
    max_seq_len: int = Field(256, ge=8, le=131072, description="Tokens per example (truncated).")
    eval_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="Share of each tenant's data held out for evaluation."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="Where every step of every party trains, distils, generates and evaluates: "
        "auto = CUDA where the process sees a GPU (a local worker: its own), else CPU. cuda on a "
        "machine without CUDA is an error before the run stores anything.",
    )
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32",
        description="Dtype the base models load in (no fp32 copy first) and autocast dtype of "
        "their forward passes; LoRA adapters, optimizer state, aggregation and everything "
        "stored stay fp32. fp16 adds a gradient scaler and needs CUDA (use bf16 on CPU).",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute activations in the backward pass instead of keeping them "
        "(Hugging Face gradient checkpointing, non-reentrant): less memory, about a third more "
        "compute, the same loss up to float rounding.",
    )
    compile: bool = Field(
        False,
        description="Compile the training forward passes (client steps, provider distillation) "
        "with torch.compile. The compile is paid once per process and model (seconds to "
        "minutes) plus once more when batch shapes first change, so it pays off for client "
        "steps of many local steps on a GPU; results match the plain path within float "
        "tolerance, not bitwise. On the CPU it needs a C++ compiler.",
    )
    kernels: Literal["none", "liger"] = Field(
        "none",
        description="liger: Liger-Kernel's fused Triton kernels (RMSNorm, RoPE, SwiGLU, fused "
        "linear cross-entropy) in the model families it supports (Llama, Mistral, Qwen2, "
        "Gemma, Phi-3, ...). Needs a CUDA GPU and `pip install liger-kernel`; not bitwise.",
    )

    @model_validator(mode="after")
    def _fp16_needs_cuda(self) -> TrainingConfig:
        if self.device == "cpu" and self.precision == "fp16":
            raise ValueError(
                "training.precision: fp16 with training.device: cpu; fp16 autocast on CPU is "
                "slow and poorly supported; use precision: bf16 (or fp32) on CPU, or "
                "device: cuda/auto on a GPU machine"
            )
        return self

    @model_validator(mode="after")
    def _steps_or_epochs(self) -> TrainingConfig:
        if (self.local_steps is None) == (self.local_epochs is None):
            raise ValueError(
                "set exactly one of local_steps and local_epochs "
                f"(got local_steps={self.local_steps}, local_epochs={self.local_epochs}); "
                "write `local_epochs: 1` together with `local_steps: null` to train by epochs"
            )
        return self


class LoraConfig(StrictModel):
    """LoRA adapter settings (Hu et al. 2022)."""

    r: int = Field(8, ge=1, le=1024, description="Rank.")
    alpha: float = Field(16.0, gt=0.0, le=4096.0, description="Scaling alpha (scale = alpha/r).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA input.")
    target_modules: list[str] | None = Field(
        None,
        description="Module names to adapt; default per architecture (Llama q_proj,v_proj; GPT-2 "
        "c_attn); [all-linear]: every linear layer of each block, on any architecture.",
    )


TOLERATION_KEYS = ("key", "operator", "value", "effect")
_OPERATORS = ("Equal", "Exists")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def check_tolerations(tolerations: list[dict[str, str]]) -> list[dict[str, str]]:
    """Refuse a toleration Kubernetes would reject (or silently misread) before it is compiled
    into a pipeline or a tenant Job."""
    for t in tolerations:
        unknown = sorted(set(t) - set(TOLERATION_KEYS))
        if unknown:
            raise ValueError(
                f"toleration {t} has unknown key(s) {unknown}; use only {list(TOLERATION_KEYS)}"
            )
        if t.get("operator", "Equal") not in _OPERATORS:
            raise ValueError(
                f"toleration {t} has operator {t['operator']!r}; use one of {list(_OPERATORS)}"
            )
        if "effect" in t and t["effect"] not in _EFFECTS:
            raise ValueError(
                f"toleration {t} has effect {t['effect']!r}; use one of {list(_EFFECTS)}, "
                "or leave it out to match every effect"
            )
        if t.get("operator") == "Exists" and t.get("value"):
            raise ValueError(f"toleration {t} has operator Exists and a value; remove the value")
        if not t.get("key") and t.get("operator") != "Exists":
            raise ValueError(
                f"toleration {t} has no key, which needs operator: Exists (tolerate every taint)"
            )
    return tolerations


class TenantResources(StrictModel):
    """What a tenant's client step asks of its cluster (ignored by the local engine)."""

    cpu: str = Field("2", pattern=r"^\d+(\.\d+)?m?$", description="CPU request and limit.")
    memory: str = Field("8Gi", pattern=r"^\d+(Ki|Mi|Gi|Ti)?$", description="Memory limit.")
    gpu: int = Field(0, ge=0, le=16, description="nvidia.com/gpu limit.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Pod nodeSelector.")
    tolerations: list[dict[str, str]] = Field(
        default_factory=list, description="Pod tolerations (key/operator/value/effect)."
    )

    @field_validator("tolerations")
    @classmethod
    def _tolerations(cls, value: list[dict[str, str]]) -> list[dict[str, str]]:
        return check_tolerations(value)


class ProviderResources(StrictModel):
    """What the provider's heavy pipeline steps ask of the cluster (server init, aggregation,
    export); compiled into the pipeline by ``fedtune compile`` (ignored by the local engines).
    """

    cpu: str | None = Field(
        None,
        pattern=r"^\d+(\.\d+)?m?$",
        description="CPU request and limit of each heavy provider step (None: the pipeline "
        "default, no request).",
    )
    memory: str | None = Field(
        None,
        pattern=r"^\d+(Ki|Mi|Gi|Ti)?$",
        description="Memory request and limit of each heavy provider step (None: the pipeline "
        "default, no request).",
    )
    gpu: int = Field(
        0,
        ge=0,
        le=16,
        description="nvidia.com/gpu limit of each heavy provider step; above 0 they run in "
        "the GPU image; above 1 server init and aggregation train on one rank per GPU "
        "(docs/multi-gpu.md).",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="nodeSelector of the heavy provider steps' pods."
    )
    tolerations: list[dict[str, str]] = Field(
        default_factory=list,
        description="Tolerations of the heavy provider steps' pods (key/operator/value/effect).",
    )
    image: str | None = Field(
        None,
        min_length=1,
        max_length=512,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$",
        description="Image of the heavy provider steps (None: the GPU image when gpu > 0, "
        "else the CPU image); it must contain this fedtune version.",
    )

    @field_validator("tolerations")
    @classmethod
    def _tolerations(cls, value: list[dict[str, str]]) -> list[dict[str, str]]:
        return check_tolerations(value)


class TenantConfig(StrictModel):
    """One data-owning tenant."""

    name: Dns1123Label = Field(description="Tenant name (DNS-1123 label).")
    data_uri: StoreUri = Field(
        min_length=1,
        max_length=2048,
        description="Training data: path, file:// or s3:// URI of a JSONL, JSON, CSV or Parquet "
        "file, or of a folder written by datasets' save_to_disk.",
    )
    data_format: Literal["auto", "alpaca", "dolly", "gsm8k", "chat"] = Field(
        "auto", description="Record format of the data (chat: 'messages' lists)."
    )
    namespace: Dns1123Label | None = Field(
        None, description="Kubernetes namespace of the tenant's steps (default: the name)."
    )
    store_uri: StoreUri | None = Field(
        None,
        max_length=2048,
        description="The tenant's private store for client state (default: under workdir).",
    )
    resources: TenantResources = Field(
        default_factory=TenantResources, description="Cluster resources of the client step."
    )
    model: ModelConfig | None = Field(
        None,
        description="The tenant's own small model (fedmkt): a tiny config or the tenant's "
        "Hugging Face directory; the job's model is the provider's.",
    )
    tokenizer: str | None = Field(
        None,
        min_length=1,
        description="The tenant's tokenizer (fedmkt; same values as the top-level tokenizer). "
        "The provider reads it to map vocabularies.",
    )
    identity_key: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description="The tenant's Ed25519 public key (hex), registered out of band: under "
        "secure aggregation every tenant verifies this tenant's signed keys against it, so the "
        "provider cannot substitute them (`fedtune identity JOB --tenant NAME` creates one).",
    )
    max_samples: int | None = Field(
        None,
        ge=1,
        le=10**9,
        description="The tenant's declared dataset size bound: an update claiming more "
        "num_samples is rejected (default: limits.max_samples_per_tenant).",
    )
    tracking: TrackingConfig | None = Field(
        None,
        description="The tenant's own MLflow (fedmkt): with it, the tenant registers the small "
        "model it exports; without it (default), the export is files in its store only.",
    )
    dp_sgd: DpSgdConfig | None = Field(
        None,
        description="Example-level DP-SGD in this tenant's client step (off when absent): "
        "`{noise_multiplier: 1.0, max_grad_norm: 1.0}`; a `dp-sgd.json` in the tenant's own "
        "store overrides it. See fedtune.config.dp_sgd.",
    )

    @model_validator(mode="after")
    def _own_tracking_uri(self) -> TenantConfig:
        if self.tracking is not None and self.tracking.backend == "mlflow" and not self.tracking.tracking_uri:
            raise ValueError(
                f"tenants[{self.name}].tracking has no tracking_uri; a tenant's registry must be "
                "its own, never the provider's default; set tenants[].tracking.tracking_uri to "
                "the tenant's MLflow, or remove the tracking section (files only)"
            )
        return self

    @property
    def k8s_namespace(self) -> str:
        """The namespace the tenant's pods run in."""
        return self.namespace or self.name


class TrackingConfig(StrictModel):
    """Experiment tracking and model registration."""

    backend: Literal["mlflow", "none"] = Field("mlflow", description="Tracker implementation.")
    tracking_uri: str | None = Field(
        None,
        description="MLflow URI; default MLFLOW_TRACKING_URI, else a SQLite store in workdir.",
    )
    experiment: str = Field("fedtune", min_length=1, max_length=256, description="Experiment.")
    registered_model: str | None = Field(
        None, max_length=256, description="Registry name of the final model (default: job name)."
    )
    alias: str = Field(
        "candidate", pattern=r"^[a-z][a-z0-9_-]{0,62}$", description="Alias set on the new version."
    )


DEFAULT_UPDATE_NORM_RATIO = 1000.0
"""limits.max_update_norm_ratio's default; why this value: fedtune.aggregation.validation."""


class LimitsConfig(StrictModel):
    """Bounds that protect the provider from malformed updates and input, and bound every
    wait on a store or the tracking server (seconds, not minutes)."""

    max_update_bytes: int = Field(
        256 * 2**20, ge=1024, le=2**40, description="Largest accepted update, in bytes."
    )
    max_samples_per_tenant: int = Field(
        1_000_000,
        ge=1,
        le=10**9,
        description="Largest num_samples an update may claim, for tenants that declare no "
        "max_samples of their own; larger claims are rejected (they would dominate a "
        "sample-weighted mean).",
    )
    max_update_norm: float | None = Field(
        None,
        gt=0.0,
        description="Largest L2 norm of an update's change from the broadcast (unset: "
        "max_update_norm_ratio bounds it); under secure aggregation each tenant checks its "
        "own before masking and the provider checks the unmasked mean.",
    )
    max_update_norm_ratio: float | None = Field(
        DEFAULT_UPDATE_NORM_RATIO,
        gt=0.0,
        le=1e12,
        description="Where max_update_norm is unset, the largest L2 norm of an update's change "
        "as a multiple of the broadcast's L2 norm (taken as at least 1.0): an update over it is "
        "rejected, naming the bound, so a finite outlier (a tensor set to 1e30) cannot swamp "
        "the mean. The default is far above any honest step (see "
        "fedtune.aggregation.validation); null turns the default bound off. Applies where "
        "updates are summed (every algorithm but FedMKT, whose knowledge messages are no "
        "change of the broadcast).",
    )
    max_record_bytes: int = Field(
        2**20,
        ge=256,
        le=2**31,
        description="Longest accepted line of a JSON Lines dataset, in bytes; a longer record "
        "is skipped (with its line number in the log) while the file is read, never held in "
        "memory whole.",
    )
    store_connect_timeout_s: float = Field(
        5.0, gt=0.0, le=600.0, description="S3 stores: seconds to wait for a connection."
    )
    store_read_timeout_s: float = Field(
        10.0,
        gt=0.0,
        le=3600.0,
        description="S3 stores: seconds to wait for the next bytes of an answer; a server "
        "silent for longer counts as an outage.",
    )
    store_max_attempts: int = Field(
        3, ge=1, le=20, description="S3 stores: tries per request, the first included."
    )
    tracking_timeout_s: int = Field(
        30, ge=1, le=3600, description="MLflow server: seconds to wait for each answer."
    )
    tracking_max_retries: int = Field(
        2, ge=0, le=10, description="MLflow server: retries of a failed request (1 s, 2 s, ... apart)."
    )

    def sample_cap(self, tenant: TenantConfig) -> int:
        """The largest num_samples ``tenant``'s update may claim."""
        return tenant.max_samples or self.max_samples_per_tenant

    def update_norm_bound(self, broadcast_norm: float, *, relative: bool = True) -> tuple[float, str] | None:
        """The bound on an update's L2 norm of change from a broadcast of L2 norm
        ``broadcast_norm``, with the setting that gives it (for messages); None when off.
        ``relative=False``: the update is no change of the broadcast (FedMKT's knowledge),
        so only an explicit max_update_norm bounds it."""
        if self.max_update_norm is not None:
            return self.max_update_norm, f"limits.max_update_norm={self.max_update_norm:g}"
        if self.max_update_norm_ratio is None or not relative:
            return None
        scale = max(broadcast_norm, 1.0)
        return self.max_update_norm_ratio * scale, (
            f"the bound {self.max_update_norm_ratio * scale:.6g} = limits.max_update_norm_ratio="
            f"{self.max_update_norm_ratio:g} times the broadcast's L2 norm {scale:.6g}"
        )


class EngineConfig(StrictModel):
    """How the job runs on this machine (``engine: local`` is short for ``{name: local}``)."""

    name: Literal["local", "kfp-local"] = Field("local", description="Default engine.")
    workers: int | Literal["auto"] = Field(
        1,
        description="Local engine: processes that run the sampled tenants' steps at once (1 = "
        "in this process, one after another; auto = one per usable CPU, capped by memory). "
        "Each worker gets its share of the CPUs. Results are bitwise equal whatever the "
        "number only when step_threads is set: otherwise the steps' thread counts differ.",
    )
    step_threads: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Torch threads of every step: the local engine's, its workers', and the "
        "pods' of a pipeline run (`fedtune run --threads` overrides it). Set it (e.g. 1) for "
        "runs that are bitwise equal whatever the number of workers and CPUs: float "
        "reductions split over threads round differently. Default: $FEDTUNE_THREADS or "
        "$OMP_NUM_THREADS if set, else the CPUs the process may use (its cgroup CPU quota "
        "and affinity mask, not the host's cores), shared among the workers.",
    )

    worker_devices: Literal["auto", "cpu"] | list[int] = Field(
        "auto",
        description="Local engine: where workers run: auto = every visible GPU, one worker "
        "per device in turn (CPU where there is none), cpu, or a list of CUDA device indices. "
        "A worker pins its device before any CUDA work (CUDA_VISIBLE_DEVICES).",
    )
    workers_per_device: int = Field(
        1,
        ge=1,
        le=64,
        description="Local engine: workers sharing one GPU; each may use 1 / this of its "
        "memory (torch.cuda.set_per_process_memory_fraction). Workers beyond devices x this "
        "are an error.",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value: object) -> object:
        return {"name": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _workers_positive(self) -> EngineConfig:
        if isinstance(self.workers, int) and not 1 <= self.workers <= 256:
            raise ValueError(f"workers={self.workers} must be between 1 and 256, or auto")
        if isinstance(self.worker_devices, list):
            devices = self.worker_devices
            if not devices or any(d < 0 for d in devices) or len(set(devices)) != len(devices):
                raise ValueError(
                    f"worker_devices={devices} must be a non-empty list of distinct CUDA device "
                    "indices (0, 1, ...), or auto, or cpu"
                )
        return self


class StorageConfig(StrictModel):
    """How much of a run the stores keep: server states are the bulk at 7B, so only the
    newest few stay."""

    state_retention: int = Field(
        2,
        ge=1,
        le=100_000,
        description="Server states kept in the provider store (newest first; a resume needs "
        "only the last one, the default 2 keeps one spare). Older states lose their tensors "
        "once a newer round is completely recorded; their small JSON record (metrics, "
        "privacy ledger) stays, as do the tenants' updates in the exchange. The provider's "
        "record of each round's broadcast and the tenants' copies of it follow the same "
        "rule.",
    )


class ExportConfig(StrictModel):
    """What the final export writes next to the base weights and the adapter."""

    merged: bool = Field(
        False,
        description="Also write a copy of the model with the adapter merged in (`merged/`), "
        "for runtimes without LoRA support (KServe without --lora, GPT-2 under vLLM). Off: "
        "the export is the base once plus `adapter/`.",
    )


class AuditConfig(StrictModel):
    """The memorization audit after training (FewFedPIT Section 5.4, after Nasr et al. 2023).

    Each selected tenant prompts the final model, as its final broadcast lets it run it, with
    the prompts of its own training records, decodes greedily and scores Rouge-L against the
    true responses. Only the scores reach the provider; record indices and generations stay
    in the tenant's private store.
    """

    enabled: bool = Field(False, description="Run the audit after export and registration.")
    tenants: list[Dns1123Label] | None = Field(
        None,
        min_length=1,
        max_length=10_000,
        description="Tenants whose training data is audited (default: all).",
    )
    records: int = Field(
        100,
        ge=1,
        le=100_000,
        description="Training records audited per tenant, drawn with the job's seed (the "
        "paper audits 100); all of them when a tenant has fewer.",
    )
    threshold: float = Field(
        0.7,
        ge=0.0,
        le=1.0,
        description="Rouge-L at or above which a record counts as reproduced (FewFedPIT's "
        "near-copy cut-off is 0.7).",
    )
    max_new_tokens: int = Field(
        64, ge=1, le=1024, description="Most tokens generated per audited prompt (greedy)."
    )


class SecureAggregationConfig(StrictModel):
    """SecAgg / SecAgg+ (Bonawitz et al. 2017; Bell et al. 2020): the provider learns only
    the sum of the round's updates."""

    enabled: bool = Field(False, description="Mask every update; the provider unmasks only the sum.")
    threshold: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="Shares needed to recover a tenant's mask secrets, out of its neighbourhood "
        "(itself and its neighbours; every sampled tenant with neighbours: all). Default: a "
        "majority of the neighbourhood; up to neighbourhood - threshold may drop after sharing keys.",
    )
    neighbours: Literal["all", "auto"] | int = Field(
        "all",
        description="SecAgg+ communication graph: 'all' (complete graph, SecAgg), 'auto' "
        "(2*ceil(log2 n) neighbours, O(log n)) or an even number K of neighbours per tenant in "
        "a Harary graph over a seeded random order of the sampled tenants.",
    )
    frac_bits: int = Field(
        24, ge=8, le=40, description="Fractional bits of the fixed-point encoding (mod 2^64)."
    )

    @model_validator(mode="after")
    def _even_degree(self) -> SecureAggregationConfig:
        k = self.neighbours
        if isinstance(k, int) and (k < 2 or k % 2):
            raise ValueError(
                f"secure_aggregation.neighbours={k} must be an even number >= 2 (a Harary graph "
                "joins k/2 tenants on each side), 'auto' or 'all'"
            )
        return self

    def degree_for(self, sampled: int) -> int:
        """Neighbours per tenant in a round of ``sampled`` tenants."""
        from fedtune.secagg.graph import degree

        return degree(self.neighbours, sampled)

    def threshold_for(self, sampled: int) -> int:
        """The threshold of a round with ``sampled`` tenants (per neighbourhood)."""
        return self.threshold or (self.degree_for(sampled) + 1) // 2 + 1


class JobConfig(StrictModel):
    """A federated fine-tuning job: who takes part, what trains, how, and where it is stored."""

    name: Dns1123Label = Field(description="Job name (DNS-1123 label); prefixes stored state.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of sampling and training.")
    workdir: str = Field(
        ".fedtune", min_length=1, description="Local work directory (default stores, MLflow)."
    )
    model: ModelConfig = Field(description="Base model.")
    tokenizer: str = Field(
        "auto",
        min_length=1,
        description="'auto' (builtin for tiny models, the model's own otherwise), 'builtin', "
        "or a Hugging Face tokenizer directory.",
    )
    algorithm: AlgorithmConfig = Field(description="Algorithm and its hyperparameters.")
    rounds: int = Field(3, ge=1, le=100_000, description="Federated rounds.")
    clients_per_round: int | None = Field(
        None, ge=1, le=100_000, description="Tenants sampled per round (default: all)."
    )
    min_clients: int = Field(1, ge=1, le=100_000, description="Quorum of valid updates per round.")
    training: TrainingConfig = Field(default_factory=TrainingConfig, description="Local training.")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA settings.")
    tenants: list[TenantConfig] = Field(min_length=1, max_length=10_000, description="Tenants.")
    public_data_uri: StoreUri | None = Field(
        None, description="Public dataset the provider may train on (algorithms that need one)."
    )
    exchange_uri: StoreUri | None = Field(
        None,
        description="Provider<->tenant exchange store, one prefix per tenant "
        "(default: workdir/exchange).",
    )
    provider_store_uri: StoreUri | None = Field(
        None,
        max_length=2048,
        description="The provider-private store: server states, round summaries, exports, "
        "audit results; tenants never read it (default: workdir/provider; required when "
        "exchange_uri is set).",
    )
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="Tracking.")
    limits: LimitsConfig = Field(
        default_factory=LimitsConfig,
        description="Bounds on updates, records, and waits on stores and the tracking server.",
    )
    audit: AuditConfig = Field(
        default_factory=AuditConfig,
        description="Memorization audit of the final model on the tenants' own data; the "
        "result tags the registered version for `fedtune promote --max-leakage`.",
    )
    secure_aggregation: SecureAggregationConfig = Field(
        default_factory=SecureAggregationConfig,
        description="Secure aggregation (off by default): `{enabled: true, threshold: 2}`.",
    )
    differential_privacy: DifferentialPrivacyConfig | None = Field(
        None,
        description="Client-level DP-FedAvg (off when absent): `{noise_multiplier: 1.0, "
        "clipping: {norm: 0.5}}`; see fedtune.config.privacy.",
    )
    provider: ProviderResources = Field(
        default_factory=ProviderResources,
        description="Cluster resources of the provider's heavy pipeline steps (server init, "
        "aggregation, export): cpu, memory, gpu, node_selector, tolerations, image. Compiled "
        "into the pipeline: a run refuses a job whose section differs from the compiled one.",
    )
    storage: StorageConfig = Field(
        default_factory=StorageConfig,
        description="What the stores keep: `{state_retention: 2}` server states.",
    )
    export: ExportConfig = Field(
        default_factory=ExportConfig,
        description="The final export: base once plus adapter; `{merged: true}` adds a merged copy.",
    )
    engine: EngineConfig = Field(
        default_factory=EngineConfig,
        description="Default engine and its workers: `local`, `kfp-local`, or "
        "`{name: local, workers: auto}`.",
    )

    #: The folder of the job file it was read from (set by the loader; not a setting).
    _source_dir: str | None = PrivateAttr(None)

    @property
    def source_dir(self) -> str | None:
        """The folder of the job file this config was read from, if it was read from one."""
        return self._source_dir

    @model_validator(mode="after")
    def _cross_checks(self) -> JobConfig:
        names = [t.name for t in self.tenants]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"tenant names must be unique; repeated: {dupes}")
        spaces = [t.k8s_namespace for t in self.tenants]
        shared = sorted({n for n in spaces if spaces.count(n) > 1})
        if shared:
            raise ValueError(
                f"tenants must not share a namespace (isolation); shared: {shared}; "
                "give each tenant its own namespace"
            )
        if self.exchange_uri and not self.provider_store_uri:
            raise ValueError(
                f"exchange_uri is set ({self.exchange_uri!r}) but provider_store_uri is not; "
                "set provider_store_uri to a store tenants cannot read (server state, summaries "
                "and exports live there, never in the exchange)"
            )
        self._check_tenant_base()
        self._check_audit()
        unknown = sorted(set(self.audit.tenants or []) - set(names))
        if unknown:
            raise ValueError(
                f"audit.tenants names {unknown}, which are not tenants of this job; use some "
                f"of {sorted(names)}, or leave audit.tenants out to audit every tenant"
            )
        self._check_tenant_models()
        self._check_scaffold_optimizer()
        per_round = self.sampled_per_round
        if per_round > len(self.tenants):
            raise ValueError(
                f"clients_per_round={per_round} exceeds the {len(self.tenants)} tenants; "
                "lower it or add tenants"
            )
        if self.min_clients > per_round:
            raise ValueError(
                f"min_clients={self.min_clients} exceeds clients_per_round={per_round}; "
                "no round could reach the quorum — lower min_clients"
            )
        self._check_secure_aggregation()
        if self.training.device == "cuda" and self.engine.worker_devices == "cpu":
            raise ValueError(
                "training.device: cuda, but engine.worker_devices: cpu places the local "
                "engine's workers on the CPU; set worker_devices to auto (or a list of GPUs), "
                "or training.device to auto or cpu"
            )
        with_dp_sgd = [t.name for t in self.tenants if t.dp_sgd is not None]
        if with_dp_sgd and (problem := dp_sgd_problem(self.algorithm.name)):
            raise ValueError(f"tenants {with_dp_sgd}: {problem}")
        if self.differential_privacy is not None:
            problems = self.differential_privacy.job_problems(
                self.algorithm.name,
                getattr(self.algorithm, "aggregation_weights", None),
                self.secure_aggregation.enabled,
                per_round,
            )
            if problems:
                raise ValueError("; ".join(problems))
        return self

    def _check_secure_aggregation(self) -> None:
        sa = self.secure_aggregation
        if not sa.enabled:
            return
        if not type(self.algorithm).capabilities.summed_update:
            raise ValueError(
                f"secure_aggregation is enabled for algorithm {self.algorithm.name!r}, whose "
                f"aggregation needs more than the sum of the updates; use one of "
                f"{summed_update_algorithms()} "
                "or set secure_aggregation.enabled: false"
            )
        n = self.sampled_per_round
        if n < 2:
            raise ValueError(
                f"secure_aggregation is enabled with {n} sampled tenant per round: the sum the "
                "provider unmasks would be that tenant's own update; sample at least 2 "
                "(clients_per_round, and as many tenants) or set secure_aggregation.enabled: false"
            )
        t = sa.threshold_for(n)
        size = sa.degree_for(n) + 1
        if not size // 2 < t <= size:
            where = f"{n} sampled tenants" if size == n else f"neighbourhoods of {size} of {n} sampled tenants"
            raise ValueError(
                f"secure_aggregation.threshold={t} must be in {size // 2 + 1}..{size} for {where} "
                "(above half, so the provider cannot unmask a single update; at most the "
                "neighbourhood, so a round can finish); change the threshold, neighbours or "
                "clients_per_round"
            )

    def _check_audit(self) -> None:
        """The memorization audit only for algorithms whose tenants can run the final model."""
        if self.audit.enabled and not type(self.algorithm).capabilities.audit:
            raise ValueError(
                f"audit.enabled is set, but algorithm {self.algorithm.name!r} cannot be "
                "audited: its tenants can run no model after training (neither one in the final "
                "broadcast nor one of their own); set audit.enabled: false, or audit with an "
                "algorithm that can be (e.g. fedavg)"
            )

    def _check_scaffold_optimizer(self) -> None:
        algorithm = self.algorithm
        if algorithm.name != "scaffold" or self.training.optimizer == "sgd":
            return
        if not getattr(algorithm, "allow_non_sgd_optimizer", False):
            raise ValueError(
                f"scaffold with training.optimizer={self.training.optimizer!r}: its control "
                "variate assumes plain SGD local steps (Karimireddy et al. 2020, option II); "
                "set training.optimizer: sgd, or algorithm.allow_non_sgd_optimizer: true to run "
                "it anyway"
            )

    def _check_tenant_models(self) -> None:
        """Per-tenant models belong to algorithms that give every tenant its own (fedmkt)."""
        own = type(self.algorithm).capabilities.tenant_models
        for tenant in self.tenants:
            carries = tenant.model is not None or tenant.tokenizer is not None
            if carries and not own:
                raise ValueError(
                    f"tenant {tenant.name!r} sets model/tokenizer, but algorithm "
                    f"{self.algorithm.name!r} trains one shared model; remove them, or use fedmkt"
                )
            if own and tenant.model is None:
                raise ValueError(
                    f"tenant {tenant.name!r} has no model: {self.algorithm.name} trains each "
                    "tenant's own small model; add `model:` (and `tokenizer:`) to its entry"
                )
        if getattr(self.algorithm, "fedavg_small", False):
            self._check_same_small_model()
        if own and not self.public_data_uri:
            raise ValueError(
                f"{self.algorithm.name} transfers knowledge on a public set, but public_data_uri "
                "is not set; set it to a JSON Lines dataset every party may read"
            )

    def _check_same_small_model(self) -> None:
        """FedMKT's homogeneous mode averages adapters: every tenant's small model must match."""
        first = self.tenants[0]
        for tenant in self.tenants[1:]:
            if tenant.model != first.model or (tenant.tokenizer or "auto") != (first.tokenizer or "auto"):
                raise ValueError(
                    "algorithm.fedavg_small: true averages the tenants' small-model adapters, so "
                    f"every tenant needs the same model and tokenizer, but tenant {tenant.name!r} "
                    f"has model {_shown(tenant.model)}, tokenizer {tenant.tokenizer or 'auto'!r} "
                    f"and tenant {first.name!r} has model {_shown(first.model)}, tokenizer "
                    f"{first.tokenizer or 'auto'!r}; give every tenant the same `model:` and "
                    "`tokenizer:`, or remove fedavg_small (heterogeneous FedMKT)"
                )

    def _check_tenant_base(self) -> None:
        """Tenants read base weights only where the job names a tenant-readable copy."""
        loads_base = type(self.algorithm).capabilities.tenants_load_base
        if not isinstance(self.model, PretrainedModelConfig):
            return
        if loads_base and not self.model.tenant_uri:
            raise ValueError(
                f"algorithm {self.algorithm.name!r} trains LoRA on the base model at each "
                "tenant, but model.tenant_uri is not set (tenants never read model.uri); set "
                "model.tenant_uri to a copy of the base weights tenants may read, or use "
                "fedbiot, which ships tenants only a compressed emulator"
            )
        if not loads_base and self.model.tenant_uri:
            raise ValueError(
                f"algorithm {self.algorithm.name!r} must not give tenants the full model, but "
                f"model.tenant_uri is set ({self.model.tenant_uri!r}); remove it (tenants get "
                "the emulator package in the broadcast)"
            )

    @property
    def sampled_per_round(self) -> int:
        """How many tenants take part in each round."""
        return self.clients_per_round or len(self.tenants)

    @property
    def registered_model_name(self) -> str:
        """Registry name of the final model."""
        return self.tracking.registered_model or self.name

    @property
    def audited_tenants(self) -> list[str]:
        """Sorted names of the tenants the memorization audit covers (empty when it is off)."""
        if not self.audit.enabled:
            return []
        return sorted(self.audit.tenants or [t.name for t in self.tenants])


def _shown(model: Any) -> str:
    """A tenant model entry as its set fields (for error messages)."""
    return str(model.model_dump(exclude_defaults=True)) if model is not None else "None"
