"""FedPT's config section and its large model's (provider only, never a tenant's)."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from fedtune.config.base import StrictModel
from fedtune.config.capabilities import Capabilities
from fedtune.config.models import TinyModelConfig
from fedtune.config.packages import AlgorithmSpec, Smoke
from fedtune.config.sections import DeepSpeedSection, WeightedMeanConfig


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
    capabilities: ClassVar[Capabilities] = Capabilities(module=f"{__package__}.algorithm", family="fedpt")
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


_LARGE = {"source": "tiny", "hidden_size": 48, "num_layers": 3, "num_heads": 2, "intermediate_size": 96}
_QUICK = {"max_generation_examples": 2, "max_new_tokens": 4}
ALGORITHM = AlgorithmSpec(
    sections=(FedPTConfig,),
    smoke={
        "fedpt": Smoke(
            {"name": "fedpt", "large_model": _LARGE, "kd_size": 8, "kd_batch_size": 4,
             "kd_steps": 2, **_QUICK},
            public_data=True,
        ),
        "fedavg-pt": Smoke({"name": "fedavg-pt", "large_model": _LARGE, **_QUICK}, public_data=True),
    },
)
