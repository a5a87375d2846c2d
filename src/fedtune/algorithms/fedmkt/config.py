"""FedMKT's config section: the tenants' distillation and scoring, the provider's LLM2SLM switch."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from fedtune.config.capabilities import Capabilities
from fedtune.config.packages import AlgorithmSpec, Smoke
from fedtune.config.sections import AlgorithmSection


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
        module=f"{__package__}.algorithm",
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


#: Every tenant brings its own small model: a GPT-2 shape beside the provider's Llama.
_SMALL = {"source": "tiny", "arch": "gpt2", "hidden_size": 16, "num_layers": 1, "num_heads": 2,
          "intermediate_size": 32, "max_position_embeddings": 256}
ALGORITHM = AlgorithmSpec(
    sections=(FedMKTConfig,),
    smoke={
        "fedmkt": Smoke(
            {"name": "fedmkt", "top_k": 4, "public_size": 4},
            public_data=True,
            tenant={"model": _SMALL, "tokenizer": "builtin"},
        ),
    },
)
