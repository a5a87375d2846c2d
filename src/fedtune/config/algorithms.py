"""Per-algorithm config sections, a discriminated union on ``name``.

Each algorithm module imports its own section from here; adding an algorithm adds one class
and one union member. Each section declares what its algorithms can do, once, as its
``capabilities`` (:mod:`fedtune.config.capabilities`); every list of algorithms elsewhere
(secure aggregation, DP, DP-SGD, pipeline families) is derived from those.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Union, get_args

from pydantic import Field, create_model, model_validator

from fedtune.config.base import StrictModel
from fedtune.config.capabilities import Capabilities, capabilities_of, names_where
from fedtune.config.models import TinyModelConfig

_PACKAGE = "fedtune.algorithms"


_WEIGHTS_HELP = (
    "How client updates are weighted in the server's mean: by their num_samples (capped by "
    "limits.max_samples_per_tenant / tenants[].max_samples) or equally (no tenant can "
    "dominate by its claimed sample count). "
)


class AlgorithmSection(StrictModel):
    """An algorithm's config section, and the part of it its tenants receive.

    ``tenant_fields`` is the allowlist of settings a tenant's phases read; the class's
    ``TenantPart`` is a model of exactly those fields (same types, bounds and defaults),
    generated once per section. Everything else (a provider's large model, its alignment
    or distillation settings) is never in a tenant's view: a new field stays with the
    provider until it is added here.
    """

    tenant_fields: ClassVar[tuple[str, ...]] = ("name",)
    TenantPart: ClassVar[type[StrictModel]]

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if "name" not in cls.model_fields:
            return  # an intermediate base (WeightedMeanConfig): no algorithm of its own
        unknown = sorted(set(cls.tenant_fields) - set(cls.model_fields))
        if unknown:
            raise TypeError(f"{cls.__name__}.tenant_fields names no field(s) {unknown}")
        fields: Any = {f: (cls.model_fields[f].annotation, cls.model_fields[f]) for f in cls.tenant_fields}
        part = create_model(f"{cls.__name__}TenantPart", __base__=StrictModel, **fields)
        part.__doc__ = f"What a tenant receives of {cls.__name__}: {', '.join(cls.tenant_fields)}."
        # The tenant side reads the section's capabilities through its part too.
        part.capabilities = cls.capabilities  # type: ignore[attr-defined]
        cls.TenantPart = part

    def tenant_part(self) -> StrictModel:
        """This section's tenant part, built field by field from the allowlist."""
        return self.TenantPart.model_validate({f: getattr(self, f) for f in self.tenant_fields})


class WeightedMeanConfig(AlgorithmSection):
    """Algorithms whose aggregation is a weighted mean of client updates.

    Each algorithm's default follows its paper: FedAvg and FedProx weight by samples
    (McMahan et al. 2017, Algorithm 1: ``w <- sum_k n_k/n w_k``; Li et al. 2020 keep it);
    FedOPT and SCAFFOLD average uniformly (Reddi et al. 2021, Algorithm 2:
    ``Delta_t = 1/|S| sum_i Delta_i``; Karimireddy et al. 2020, Algorithm 1 line 16).
    """

    #: A tenant weights its securely summed update itself (``sum_weight``).
    tenant_fields: ClassVar[tuple[str, ...]] = ("name", "aggregation_weights")


    aggregation_weights: Literal["samples", "uniform"] = Field(
        "samples",
        description=_WEIGHTS_HELP + "Default samples (McMahan et al. 2017, Algorithm 1).",
    )


class UniformMeanConfig(WeightedMeanConfig):
    """A weighted-mean algorithm whose paper averages client updates uniformly."""

    aggregation_weights: Literal["samples", "uniform"] = Field(
        "uniform",
        description=_WEIGHTS_HELP
        + "Default uniform (Reddi et al. 2021, Algorithm 2; Karimireddy et al. 2020, "
        "Algorithm 1 line 16).",
    )


class FedAvgConfig(WeightedMeanConfig):
    """FedAvg on LoRA adapters (McMahan et al. 2017; FedIT, Zhang et al. 2024)."""

    #: Tenants train LoRA on the base model (a tenant-readable copy, see model.tenant_uri);
    #: the server folds a weighted mean of the adapters (a sum, so secure aggregation and
    #: central DP apply).
    capabilities: ClassVar[Capabilities] = Capabilities(
        module=f"{_PACKAGE}.fedavg", family="fedit", central_dp=True, splittable_client_step=True
    )

    name: Literal["fedavg"] = Field(description="Algorithm name.")


class FedProxConfig(WeightedMeanConfig):
    """FedProx (Li et al. 2020): FedAvg plus a proximal term on the client."""

    #: As FedAvg; the proximal term reads only the broadcast.
    capabilities: ClassVar[Capabilities] = Capabilities(
        module=f"{_PACKAGE}.fedprox", family="fedit", central_dp=True, splittable_client_step=True
    )

    tenant_fields: ClassVar[tuple[str, ...]] = ("name", "aggregation_weights", "mu")

    name: Literal["fedprox"] = Field(description="Algorithm name.")
    mu: float = Field(
        0.01, ge=0.0, le=100.0, description="Proximal weight mu in (mu/2)*||w - w_global||^2."
    )


class ScaffoldConfig(UniformMeanConfig):
    """SCAFFOLD option II (Karimireddy et al. 2020) with client control variates.

    Its server update averages client models and control deltas uniformly (Algorithm 1,
    lines 16-17), the default; ``aggregation_weights: samples`` weights the model mean by
    samples, while the control variate stays the uniform mean (``c`` must remain the mean
    of every client's ``c_i``, Algorithm 1 line 17). Its control variate assumes plain SGD
    local steps: a job with another client optimizer is refused unless
    ``allow_non_sgd_optimizer`` is set.
    """

    #: Line 17 needs only the sums of y_i and of c_i+ - c_i: secure aggregation can run it.
    #: Central DP is refused: clipping the adapter delta leaves the control variates unbounded.
    capabilities: ClassVar[Capabilities] = Capabilities(
        module=f"{_PACKAGE}.scaffold", family="fedit", splittable_client_step=True
    )

    name: Literal["scaffold"] = Field(description="Algorithm name.")
    global_lr: float = Field(
        1.0, gt=0.0, le=10.0, description="Server learning rate eta_g in x += eta_g * mean(y_i - x)."
    )
    allow_non_sgd_optimizer: bool = Field(
        False,
        description="Run with training.optimizer other than sgd anyway. The option-II control "
        "variate c_i+ = c_i - c + (x - y_i)/(K*lr) assumes K plain SGD steps; with AdamW it "
        "no longer estimates the client's gradient drift.",
    )


class FedOptConfig(UniformMeanConfig):
    """FedOPT (Reddi et al. 2021, Algorithm 2): a server optimizer on the mean client delta,
    uniform by default as in Algorithm 2 (``aggregation_weights: samples`` for FedAvg's).

    No bias correction, as in the paper. ``eta``/``tau`` defaults follow the paper's LoRA-scale
    sweeps rather than Flower's (eta=0.1, tau=1e-3 makes first steps several times the delta).
    """

    #: As FedAvg on the client; the server optimizer reads only the mean delta.
    capabilities: ClassVar[Capabilities] = Capabilities(
        module=f"{_PACKAGE}.fedopt", family="fedit", central_dp=True, splittable_client_step=True
    )

    name: Literal["fedopt", "fedadagrad", "fedadam", "fedyogi"] = Field(
        description="fedadagrad / fedadam / fedyogi, or fedopt with an explicit server_optimizer."
    )
    server_optimizer: Literal["sgd", "adagrad", "adam", "yogi"] | None = Field(
        None,
        description="Only for name=fedopt: the server optimizer. Implied by the other names.",
    )
    eta: float = Field(1e-2, gt=0.0, le=10.0, description="Server learning rate eta.")
    beta1: float = Field(0.9, ge=0.0, lt=1.0, description="First-moment decay beta_1.")
    beta2: float = Field(0.99, ge=0.0, lt=1.0, description="Second-moment decay beta_2.")
    tau: float = Field(1e-3, gt=0.0, le=1.0, description="Adaptivity tau (added to sqrt(v)).")

    @model_validator(mode="after")
    def _optimizer_only_for_fedopt(self) -> FedOptConfig:
        if self.name != "fedopt" and self.server_optimizer is not None:
            raise ValueError(
                f"server_optimizer={self.server_optimizer!r} conflicts with name={self.name!r}; "
                "drop server_optimizer, or set name: fedopt"
            )
        return self

    @property
    def optimizer(self) -> Literal["sgd", "adagrad", "adam", "yogi"]:
        """The server optimizer this section selects."""
        implied = {"fedadagrad": "adagrad", "fedadam": "adam", "fedyogi": "yogi"}
        if self.name == "fedopt":
            return self.server_optimizer or "sgd"
        return implied[self.name]  # type: ignore[return-value]


class DeepSpeedSection(StrictModel):
    """Run the provider's emulator alignment under DeepSpeed ZeRO (FedBiOT family).

    Either inline settings (``zero_stage``, ``bf16``) or ``config_path``, a DeepSpeed JSON
    file used as given (batch sizes are filled in when it leaves them out). Single process
    on CPU needs nothing else; with ``provider.gpu > 1`` the step starts one rank per GPU
    itself (docs/multi-gpu.md).
    """

    zero_stage: Literal[2, 3] | None = Field(
        None, description="ZeRO stage (2 or 3); default 2 unless config_path is given."
    )
    bf16: bool | None = Field(
        None, description="Train the emulator in bfloat16 under DeepSpeed (default false)."
    )
    config_path: str | None = Field(
        None,
        min_length=1,
        max_length=2048,
        description="Path of a DeepSpeed JSON config (relative to the working directory); "
        "exclusive with zero_stage and bf16.",
    )

    @model_validator(mode="after")
    def _inline_or_file(self) -> DeepSpeedSection:
        if self.config_path is not None and (self.zero_stage is not None or self.bf16 is not None):
            raise ValueError(
                f"deepspeed.config_path={self.config_path!r} conflicts with inline settings "
                f"(zero_stage={self.zero_stage}, bf16={self.bf16}); set them in the JSON file "
                "or drop config_path"
            )
        return self


class OffsiteFamilyConfig(WeightedMeanConfig):
    """Settings shared by FedBiOT and its baselines Offsite-tuning and FedOT.

    The provider splits its model into an adapter (trained by tenants) and an emulator
    (a layer-dropped copy of the rest, aligned on public data by the provider only).
    """

    #: Tenants never get the full model: only the emulator package in the broadcast.
    capabilities: ClassVar[Capabilities] = Capabilities(
        module=f"{_PACKAGE}.fedbiot.algorithm", family="fedbiot", tenants_load_base=False
    )
    #: What a tenant's client step and AdapEmu evaluation read; the split, the alignment and
    #: the delta encoding are the provider's.
    tenant_fields: ClassVar[tuple[str, ...]] = (
        "name", "aggregation_weights", "adapter_training", "eval_every", "exact_match",
        "gsm8k_shots", "max_new_tokens", "max_generation_examples",
    )

    dropout: float = Field(
        0.2,
        ge=0.0,
        lt=1.0,
        description="Layer dropout rate 1 - beta of the emulator (paper: 0.2 or 0.5).",
    )
    pre_distill_steps: int = Field(
        500,
        ge=0,
        le=1_000_000,
        description="Emulator alignment steps (Eq. 2) on public data before round 1 (paper 500).",
    )
    kl_lambda: float = Field(
        0.0,
        ge=0.0,
        le=100.0,
        description="lambda of Eq. 2: weight of KL(full+adapter || emulator+adapter) "
        "(paper 0 for GSM8K/Dolly, 0.9 for code).",
    )
    normalize_l2: bool = Field(
        True,
        description="L2 term as mean(((t - s)/rms(t))^2) per token (as the reference does) "
        "instead of the plain mean squared error.",
    )
    align_lr: float = Field(
        5e-4, gt=0.0, le=10.0, description="Learning rate of the emulator alignment."
    )
    align_batch_size: int = Field(
        4, ge=1, le=4096, description="Public examples per alignment step."
    )
    align_optimizer: Literal["sgd", "adamw"] = Field(
        "sgd",
        description="Alignment optimizer (paper: SGD). AdamW moments restart with every "
        "alignment phase (pre-distillation, each round), since only weights are kept in state.",
    )
    public_eval_fraction: float = Field(
        0.1,
        ge=0.0,
        lt=1.0,
        description="Share of the public dataset held out to measure alignment and AdapFu.",
    )
    adapter_training: Literal["full", "lora"] = Field(
        "full",
        description="Tenants train the adapter layers' full weights (paper) or a LoRA on them "
        "(the job's lora section).",
    )
    delta_dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="dtype of the per-round emulator delta sent to tenants (bfloat16 halves "
        "the bytes; the provider tracks the tenants' copy, so rounding does not accumulate).",
    )
    eval_every: int = Field(
        1,
        ge=1,
        le=100_000,
        description="Evaluate AdapEmu (tenants) and AdapFu (provider, public held-out) every "
        "N rounds.",
    )
    exact_match: Literal["auto", "gsm8k", "off"] = Field(
        "auto",
        description="GSM8K exact match of AdapEmu on a tenant's held-out split: 'auto' when "
        "every held-out answer ends in 'The answer is N'.",
    )
    gsm8k_shots: int = Field(
        8, ge=0, le=8, description="Demonstrations in the GSM8K prompt (paper: 8)."
    )
    max_new_tokens: int = Field(
        128, ge=1, le=4096, description="Greedy tokens generated per exact-match question."
    )
    max_generation_examples: int = Field(
        32, ge=1, le=100_000, description="Held-out questions scored by exact match per eval."
    )
    deepspeed: DeepSpeedSection | None = Field(
        None, description="Run emulator alignment under DeepSpeed ZeRO-2/3 (default: plain torch)."
    )


class FedBiOTConfig(OffsiteFamilyConfig):
    """FedBiOT (Wu et al. 2024): last-s-layer adapter, per-round emulator alignment."""

    tenant_fields: ClassVar[tuple[str, ...]] = (*OffsiteFamilyConfig.tenant_fields, "eps")

    name: Literal["fedbiot"] = Field(description="Algorithm name.")
    adapter_size: int = Field(
        2, ge=1, le=1024, description="Adapter size s: the last s decoder layers (paper 2 or 4)."
    )
    eps: float = Field(
        1.0,
        ge=0.0,
        le=100.0,
        description="Proximal weight epsilon of Eq. 1: (eps/2)*||w_A - w_A^t||^2 "
        "(paper 1.0 GSM8K/Dolly, 0.1 code).",
    )
    align_steps: int = Field(
        10,
        ge=0,
        le=100_000,
        description="Emulator alignment steps per round, after aggregation (paper 10).",
    )
    adapter_placement: Literal["top", "edges"] = Field(
        "top",
        description="Where the adapter's adapter_size layers sit: the last ones (paper, "
        "Algorithm 2) or half first, half last (FedOT's placement; an ablation, not in the "
        "paper; adapter_size must be even).",
    )

    @model_validator(mode="after")
    def _edges_split_evenly(self) -> FedBiOTConfig:
        if self.adapter_placement == "edges" and self.adapter_size % 2:
            raise ValueError(
                f"adapter_placement='edges' splits adapter_size={self.adapter_size} layers "
                "evenly between the first and last layers; use an even adapter_size (e.g. 4 "
                "for first 2 + last 2)"
            )
        return self


class FedOTConfig(OffsiteFamilyConfig):
    """FedOT (Kuang et al. 2023): first-2 + last-2 adapter, one-shot distillation, FedAvg."""

    name: Literal["fedot"] = Field(description="Algorithm name.")


class OffsiteTuningConfig(OffsiteFamilyConfig):
    """Offsite-tuning (Xiao et al. 2023): FedOT with one tenant that holds all the data."""

    name: Literal["offsite-tuning"] = Field(description="Algorithm name.")


class LargePretrainedConfig(StrictModel):
    """FedPT's large model as a Hugging Face directory the provider loads for logits only."""

    source: Literal["pretrained"] = Field(description="Load a Hugging Face directory.")
    uri: str = Field(
        min_length=1,
        max_length=2048,
        description="Path or URI of the large model's directory (provider only; never trained, "
        "never sent to tenants).",
    )


class LargeHttpConfig(StrictModel):
    """FedPT's large model behind an OpenAI-style completions endpoint (black box).

    The endpoint must return top-k log-probabilities of prompt tokens (``echo`` with
    ``logprobs``; vLLM and the OpenAI legacy completions API do). Only the top ``top_k``
    tokens per position are known: the rest of the probability mass is spread evenly over the
    other tokens, so proxy-tuning through HTTP is an approximation of Eq. 3.
    """

    source: Literal["http"] = Field(description="Query an OpenAI-style completions endpoint.")
    url: str = Field(
        min_length=1,
        max_length=2048,
        pattern=r"^https?://",
        description="Completions URL, e.g. http://vllm.provider.svc:8000/v1/completions.",
    )
    model: str = Field(
        min_length=1, max_length=256, description="The endpoint's model name (request field)."
    )
    tokenizer: str = Field(
        min_length=1,
        max_length=2048,
        description="The large model's tokenizer (a directory or 'builtin'): compared with the "
        "small model's, and used to map returned tokens to ids.",
    )
    top_k: int = Field(
        20,
        ge=1,
        le=262144,
        description="Log-probabilities per position the endpoint returns (vLLM caps it with "
        "--max-logprobs, default 20; the OpenAI API at 5). Larger is closer to Eq. 3.",
    )
    timeout_s: float = Field(60.0, gt=0.0, le=3600.0, description="Timeout of one request.")
    max_retries: int = Field(
        3, ge=0, le=20, description="Retries of a failed request (exponential backoff)."
    )
    batch_size: int = Field(8, ge=1, le=1024, description="Prompts per request.")
    api_key_env: str | None = Field(
        None,
        pattern=r"^[A-Z_][A-Z0-9_]{0,127}$",
        description="Environment variable holding the API key (sent as a Bearer token; never "
        "logged). None: no Authorization header.",
    )


LargeModelConfig = Annotated[
    TinyModelConfig | LargePretrainedConfig | LargeHttpConfig, Field(discriminator="source")
]


class FedPTConfig(WeightedMeanConfig):
    """FedPT ("FedPT: Federated Proxy-Tuning of Large Language Models on Resource-Constrained
    Edge Devices", papers/002): tenants federate the small model (the job's ``model``);
    the provider proxy-tunes its black-box ``large_model`` (Eq. 3) and distils it back into the
    small one each round (Eq. 5). ``fedavg-pt`` is FedAvg with proxy-tuning at inference only.

    KD defaults are the paper's GPT-2 values (Appendix B.5, Table 5: KD set 128, batch 16,
    8 iterations); LLaMA used 512 / 32 / 16.
    """

    #: Tenants train LoRA on the small model (a tenant-readable copy, see model.tenant_uri).
    capabilities: ClassVar[Capabilities] = Capabilities(module=f"{_PACKAGE}.fedpt.algorithm", family="fedpt")
    #: Tenants run FedAvg's client step: the large model and every distillation setting
    #: stay with the provider.
    tenant_fields: ClassVar[tuple[str, ...]] = ("name", "aggregation_weights")

    name: Literal["fedpt", "fedavg-pt"] = Field(
        description="fedpt: distil the proxy-tuned large model into the small one every round; "
        "fedavg-pt: no distillation (proxy-tuning at inference only)."
    )
    large_model: LargeModelConfig = Field(
        description="The provider's large model, queried for logits only. Must share the small "
        "model's vocabulary."
    )
    alpha: float = Field(
        1.0,
        ge=0.0,
        le=100.0,
        allow_inf_nan=False,
        description="Weight of the small model's tuning direction in Eq. 3: "
        "z_large + alpha * (z_small_ft - z_small_pre) (paper: searched per task).",
    )
    gamma: float = Field(
        1.0,
        ge=0.0,
        le=100.0,
        allow_inf_nan=False,
        description="Weight of KL(proxy || small) against the CE term in Eq. 5.",
    )
    kd_size: int = Field(
        128, ge=1, le=1_000_000, description="Public examples in the KD set (paper 128 / 512)."
    )
    kd_batch_size: int = Field(16, ge=1, le=4096, description="KD batch size (paper 16 / 32).")
    kd_steps: int = Field(
        8, ge=0, le=1_000_000, description="KD iterations per round (paper 8 / 16)."
    )
    kd_lr: float | None = Field(
        None, gt=0.0, le=10.0, description="KD learning rate (default: training.lr)."
    )
    public_eval_fraction: float = Field(
        0.1,
        ge=0.0,
        lt=1.0,
        description="Share of the public dataset held out from the KD set to measure KL(proxy "
        "|| small) before and after distillation.",
    )
    eval_every: int = Field(
        1, ge=1, le=100_000, description="Score generations on the public held-out set every N "
        "rounds (provider; Rouge-L, Dist-3/4 of the small and the proxy-tuned model)."
    )
    max_new_tokens: int = Field(
        64, ge=1, le=4096, description="Tokens generated per evaluation prompt (greedy)."
    )
    max_generation_examples: int = Field(
        16, ge=0, le=100_000, description="Held-out prompts generated per evaluation (0: none)."
    )
    deepspeed: DeepSpeedSection | None = Field(
        None, description="Run the distillation under DeepSpeed ZeRO-2/3 (default: plain torch)."
    )


class FewFedPITConfig(WeightedMeanConfig):
    """FewFedPIT ("FewFedPIT: Towards Privacy-preserving and Few-shot Federated Instruction
    Tuning", papers/004, Algorithm 1): each tenant trains private parameters W^l on its own
    data, grows its data with synthetic examples generated by the global model and filtered,
    trains the public parameters W^g on them, and uploads ``beta*W^l + (1-beta)*W^g``.

    Defaults follow the paper: 8 instruction demonstrations, 4 response demonstrations, 3
    attempts (2 retries), Rouge-L 0.7 similarity cut-off, the best 16 of 32 candidates by IFS,
    beta 0.5.
    """

    #: Tenants fine-tune LoRA on the base model, as in FedIT.
    capabilities: ClassVar[Capabilities] = Capabilities(
        module=f"{_PACKAGE}.fewfedpit.algorithm",
        family="fewfedpit",
        dp_sgd_refused="its synthetic data is generated from the tenant's private examples "
        "directly (prompts), which DP-SGD does not cover",
    )
    #: Algorithm 1 runs on the tenant: every setting of the section is the tenant's.
    tenant_fields: ClassVar[tuple[str, ...]] = (
        "name", "aggregation_weights", "beta", "candidates", "keep", "instruction_demos",
        "response_demos", "retries", "similarity_threshold", "min_instruction_words",
        "max_new_tokens", "generation_batch_size", "synthetic_steps", "too_few_records",
    )

    name: Literal["fewfedpit"] = Field(description="FewFedPIT (few-shot, privacy-preserving).")
    beta: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="Share of the private parameters in the upload, beta*W^l + (1-beta)*W^g "
        "(1: FedAvg's upload; 0: only parameters trained on synthetic data leave the tenant).",
    )
    candidates: int = Field(
        32, ge=1, le=10_000, description="Synthetic candidates generated per round (paper: 2M)."
    )
    keep: int = Field(
        16, ge=1, le=10_000, description="Candidates kept by IFS, lowest first (paper: M = 16)."
    )
    instruction_demos: int = Field(
        8, ge=1, le=64, description="Local instructions shown to generate a new instruction."
    )
    response_demos: int = Field(
        4, ge=1, le=64, description="Local examples shown to generate an input and response "
        "(half with an input, half without, alternating)."
    )
    retries: int = Field(
        2, ge=0, le=20, description="New demonstrations tried after a response fails a filter "
        "(retries + 1 attempts; the paper discards an instruction after three failures: 2)."
    )
    similarity_threshold: float = Field(
        0.7,
        ge=0.0,
        le=1.0,
        description="Drop generated instructions and examples whose Rouge-L to a local one "
        "exceeds this.",
    )
    min_instruction_words: int = Field(
        3, ge=1, le=100, description="Format filter: shorter instructions are dropped."
    )
    max_new_tokens: int = Field(
        48, ge=1, le=4096, description="Tokens generated per instruction or response (greedy)."
    )
    generation_batch_size: int = Field(
        8, ge=1, le=1024, description="Prompts decoded together (KV-cached batched generation)."
    )
    synthetic_steps: int | None = Field(
        None, ge=1, le=1_000_000, description="Steps training W^g on the synthetic data "
        "(default: training.local_steps)."
    )
    too_few_records: Literal["local-only", "refuse"] = Field(
        "local-only",
        description="A tenant with fewer records than instruction_demos: 'local-only' skips "
        "synthetic data that round (W^g stays the global adapter; the reason is in the summary); "
        "'refuse' fails its step.",
    )

    @model_validator(mode="after")
    def _keep_at_most_candidates(self) -> FewFedPITConfig:
        if self.keep > self.candidates:
            raise ValueError(
                f"keep={self.keep} is larger than candidates={self.candidates}: IFS keeps the "
                "best `keep` of the `candidates` generated; lower keep or raise candidates"
            )
        return self


class FedMKTConfig(AlgorithmSection):
    """FedMKT ("FedMKT: Federated Mutual Knowledge Transfer for Large and Small Language
    Models", papers/003): the provider's LLM (the job's ``model``) and every tenant's own small
    model (``tenants[].model`` / ``tenants[].tokenizer``, any architecture and tokenizer) teach
    each other through top-k knowledge on the shared public set (``public_data_uri``), selected
    by DualMinCE; no weights cross. Defaults are the paper's (lambda = 0.9, k = 128, one epoch
    per phase).
    """

    #: Tenants never build the provider's model; each builds, keeps and exports its own
    #: (tenants[].model), and computes knowledge on the public set all parties share. Its
    #: knowledge is no sum (no secure aggregation); the memorization audit runs each audited
    #: tenant's own small model (its final broadcast carries no model a tenant could run).
    capabilities: ClassVar[Capabilities] = Capabilities(
        module=f"{_PACKAGE}.fedmkt.algorithm",
        family="fedmkt",
        tenants_load_base=False,
        summed_update=False,
        dp_sgd_refused="its tenants also distil their own small model on public data with a "
        "separate optimizer and release knowledge from it, outside the DP-SGD loop",
        tenant_models=True,
        tenants_read_public=True,
        tenant_keeps_model=True,
    )
    #: The tenant's distillation and scoring; llm_frozen is the provider's.
    tenant_fields: ClassVar[tuple[str, ...]] = (
        "name", "ce_weight", "top_k", "public_size", "kd_epochs", "kd_batch_size", "kd_lr",
        "llm_eval_size", "eval_max_options", "eval_max_new_tokens", "fedavg_small",
    )

    name: Literal["fedmkt"] = Field(description="Algorithm name.")
    ce_weight: float = Field(
        0.9,
        allow_inf_nan=False,
        description="lambda in lambda*CE + (1-lambda)*KD: the weight of the cross-entropy term "
        "on the public set; 1 - ce_weight weights the distillation term (paper: 0.9).",
    )
    top_k: int = Field(
        128, ge=1, le=1_000_000, description="Top-k next-token predictions per position in "
        "knowledge messages (at most the smallest vocabulary)."
    )
    public_size: int | None = Field(
        None, ge=1, le=1_000_000, description="Use the first N public examples (default: all)."
    )
    kd_epochs: int = Field(1, ge=1, le=1000, description="Passes over the public set per distillation.")
    kd_batch_size: int = Field(4, ge=1, le=4096, description="Distillation batch size (paper: 4).")
    kd_lr: float | None = Field(
        None, gt=0.0, le=10.0, description="Distillation learning rate (default: training.lr)."
    )
    llm_eval_size: int = Field(
        0, ge=0, le=1_000_000, description="The last N public examples are held out of the "
        "transfer and score the provider's LLM every round (0: the LLM is not scored)."
    )
    eval_max_options: int = Field(
        8, ge=2, le=1000, description="A category whose responses take at most this many "
        "distinct values is scored as multiple choice (option log-likelihood); other examples "
        "by Rouge-L of the greedy answer."
    )
    eval_max_new_tokens: int = Field(
        32, ge=1, le=4096, description="Most tokens generated per answer scored by Rouge-L."
    )
    fedavg_small: bool = Field(
        False,
        description="Homogeneous mode (paper 003, Table 3): every tenant declares the same "
        "small model (equal `model:` and `tokenizer:` entries, the job's `lora:` on all); each "
        "round the provider also averages the small models' LoRA adapters (FedAvg, weighted by "
        "samples) and broadcasts the average, which every tenant starts its next round from. "
        "Only adapters cross, never base weights.",
    )
    llm_frozen: bool = Field(
        False,
        description="LLM2SLM (the paper's one-way baseline): the provider never distils the "
        "tenants' knowledge into the LLM; it only broadcasts the frozen LLM's knowledge.",
    )

    @model_validator(mode="after")
    def _ce_weight_in_unit_interval(self) -> FedMKTConfig:
        if not 0.0 <= self.ce_weight <= 1.0:
            raise ValueError(
                f"algorithm.ce_weight={self.ce_weight} is outside [0, 1]: it is lambda in "
                "lambda*CE + (1-lambda)*KD; set it between 0 and 1 (paper: 0.9)"
            )
        return self


AlgorithmConfig = Annotated[
    FedAvgConfig
    | FedProxConfig
    | ScaffoldConfig
    | FedOptConfig
    | FedBiOTConfig
    | FedOTConfig
    | OffsiteTuningConfig
    | FedPTConfig
    | FewFedPITConfig
    | FedMKTConfig,
    Field(discriminator="name"),
]


def tenants_load_base(name: str) -> bool:
    """Whether the tenants of algorithm ``name`` build the base model themselves.

    Raises:
        KeyError: No config section has that algorithm name.
    """
    return capabilities_of(name).tenants_load_base


def summed_update_algorithms() -> list[str]:
    """Algorithm names whose aggregation needs only the sum of the updates (secure aggregation)."""
    return sorted(names_where("summed_update"))


def algorithm_sections() -> tuple[type[AlgorithmSection], ...]:
    """Every algorithm's config section (the members of :data:`AlgorithmConfig`)."""
    return tuple(get_args(get_args(AlgorithmConfig)[0]))


#: The tenant part of any algorithm's section, told apart by ``name`` (what a tenant's view
#: carries; see :mod:`fedtune.config.tenant_view`).
AlgorithmTenantPart: Any = Annotated[
    Union[tuple(s.TenantPart for s in algorithm_sections())],  # noqa: UP007 - built at run time
    Field(discriminator="name"),
]
