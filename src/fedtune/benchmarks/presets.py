"""Named benchmark settings: ``default`` (the documented numbers), ``deep`` (a six-layer
"large" for the FedBiOT family) and ``ci`` (seconds).

Each preset has two quality settings: ``quality`` on the suite's tenants, and
``fewshot_quality`` (``fedtune bench quality --split fewshot``), FewFedPIT's comparison on the
few-shot split with the memorization audit. ``fedmkt_quality`` (``fedtune bench quality
--comparison fedmkt``) is FedMKT's comparison: the benchmark's model as the LLM, the ``small``
model as every tenant's SLM, against Zero-Shot, Standalone, Centralized, FedAvg and LLM2SLM.

Command-line options override single fields of a preset; everything else follows it, so a
workspace pretrained with one preset is benchmarked with the same one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Final

from fedtune.benchmarks.fewshot_split import FewShotSpec
from fedtune.benchmarks.pretrain import ModelShape, PretrainSpec
from fedtune.benchmarks.quality import QualitySpec
from fedtune.benchmarks.server_memory import ServerMemorySpec
from fedtune.benchmarks.suite import SuiteSpec
from fedtune.benchmarks.system import PeerSpec, SystemSpec
from fedtune.core.errors import ConfigError

__all__ = ["PRESETS", "Preset", "get_preset"]


@dataclass(frozen=True)
class Preset:
    """Suite, base models, and the two benchmarks' settings."""

    suite: SuiteSpec
    models: dict[str, PretrainSpec]
    quality: QualitySpec
    fewshot_quality: QualitySpec
    fedmkt_quality: QualitySpec
    system: SystemSpec = field(default_factory=SystemSpec)


# FewFedPIT's comparison: FedIT's methods, Centralized and three betas of FewFedPIT.
FEWSHOT_METHODS: Final[tuple[str, ...]] = (
    "fedavg",
    "fedprox",
    "scaffold",
    "fedadam",
    "fewfedpit@beta=0",
    "fewfedpit@beta=0.5",
    "fewfedpit@beta=1",
)

# FedMKT's comparison (paper 003's baselines): FedMKT, FedMKT with FedAvg of the tenants'
# identical SLMs (the paper's homogeneous FedMKT), LLM2SLM (the LLM frozen), and Zero-Shot,
# Standalone SLMs, Centralized LLM, FedAvg of the SLMs.
FEDMKT_METHODS: Final[tuple[str, ...]] = (
    "fedmkt",
    "fedmkt@fedavg_small=true",
    "fedmkt@llm_frozen=true",
)
FEDMKT_BASELINES: Final[tuple[str, ...]] = (
    "zero-shot",
    "standalone-small",
    "centralized",
    "fedavg-small",
)


_DEFAULT = Preset(
    suite=SuiteSpec(),
    models={
        # Four layers learn arithmetic in 1,500 steps (EM 0.67); six layers did not (0.10).
        # FedOT and Offsite-tuning need at least five: see the "deep" preset.
        "large": PretrainSpec(
            shape=ModelShape(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=256),
            steps=1500,
        ),
        "small": PretrainSpec(
            shape=ModelShape(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128),
            steps=1500,
        ),
    },
    quality=QualitySpec(),
    # 10 tenants, 2 sampled per round (the paper's setting); 10 rounds of about two epochs of
    # a tenant's ~16 records; synthesis kept small (generation dominates a FewFedPIT round).
    fewshot_quality=QualitySpec(
        algorithms=FEWSHOT_METHODS,
        baselines=("zero-shot", "centralized"),
        split="fewshot",
        fewshot=FewShotSpec(),
        clients_per_round=2,
        audit_records=100,
        rounds=10,
        local_steps=4,
        eval_every=5,
        algorithm_params={"fewfedpit": {"candidates": 8, "keep": 4, "max_new_tokens": 32}},
    ),
    # Knowledge on the first 128 public records, top-64 (the paper: k = 128 on all of its
    # public set), the paper's distillation batch of 4: a run takes about a minute.
    fedmkt_quality=QualitySpec(
        algorithms=FEDMKT_METHODS,
        baselines=FEDMKT_BASELINES,
        eval_every=4,
        algorithm_params={"fedmkt": {"public_size": 128, "top_k": 64}},
    ),
    system=SystemSpec(),
)

# Everything tiny: the CI tests run both benchmarks end to end in well under a minute.
_CI_SHAPE = ModelShape(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
_CI_QUALITY = QualitySpec(
    algorithms=("fedavg", "scaffold"),
    seeds=(0,),
    rounds=2,
    local_steps=2,
    batch_size=4,
    lora_r=4,
    lora_alpha=8.0,
    max_seq_len=128,
    eval_every=1,
)
_CI = Preset(
    # Pathological shards are equal in size, so SCAFFOLD's first round must equal FedAvg's
    # (the CI test checks it).
    suite=SuiteSpec(
        tenants=3,
        private_records=150,
        partition="pathological",
        public_records=60,
        pretrain_records=60,
        test_per_category=3,
    ),
    models={
        "large": PretrainSpec(shape=_CI_SHAPE, steps=6, batch_size=8, warmup_steps=2),
        "small": PretrainSpec(
            shape=ModelShape(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32),
            steps=4,
            batch_size=8,
            warmup_steps=1,
        ),
    },
    quality=_CI_QUALITY,
    fewshot_quality=replace(
        _CI_QUALITY,
        algorithms=FEWSHOT_METHODS,
        baselines=("zero-shot", "centralized"),
        split="fewshot",
        fewshot=FewShotSpec(tenants=4, clusters=5, per_cluster=5),
        clients_per_round=2,
        audit_records=8,
        local_steps=1,
        algorithm_params={
            "fewfedpit": {
                "instruction_demos": 2,
                "response_demos": 2,
                "candidates": 2,
                "keep": 1,
                "retries": 0,
                "max_new_tokens": 8,
            }
        },
    ),
    fedmkt_quality=replace(
        _CI_QUALITY,
        algorithms=FEDMKT_METHODS,
        baselines=FEDMKT_BASELINES,
        algorithm_params={"fedmkt": {"public_size": 8, "top_k": 8, "kd_batch_size": 4}},
    ),
    system=SystemSpec(
        batch_size=4,
        steps=2,
        reps=2,
        lora_r=4,
        lora_alpha=8.0,
        max_seq_len=128,
        engine_rounds=2,
        engine_local_steps=1,
        algorithms=("fedavg", "scaffold"),
        deepspeed=False,
        peer=PeerSpec(rounds=1, tenants=2, steps=2, batch_size=4, workers=(1, 2), reps=1),
        server=ServerMemorySpec(
            hidden_size=32,
            num_layers=1,
            num_heads=2,
            intermediate_size=64,
            batch_size=2,
            seq_len=16,
            steps=2,
            zero3_ranks=(1,),
        ),
    ),
)

# The default with a six-layer "large": FedOT and Offsite-tuning keep the first two and last
# two layers as the adapter and need emulator layers between them.
_DEEP = replace(
    _DEFAULT,
    models={
        **_DEFAULT.models,
        "large": replace(
            _DEFAULT.models["large"], shape=replace(_DEFAULT.models["large"].shape, num_layers=6)
        ),
    },
)

# The FedBiOT family's base (issue 16): eight layers, so that dropping layers changes the
# model and the adapter sits on real depth; a larger pretraining corpus (12,000 records of the
# public mixture beyond the public set) for twice the default's steps, so that the deeper
# model learns as much per epoch as the four-layer one. 0.44 s per step on one thread: about
# 22 minutes on an idle core.
LARGE_DEEP: Final = PretrainSpec(
    shape=ModelShape(hidden_size=128, num_layers=8, num_heads=4, intermediate_size=256),
    steps=3000,
    warmup_steps=100,
)
_FEDBIOT_SUITE: Final = SuiteSpec(pretrain_records=12000)
_FEDBIOT = replace(_DEFAULT, suite=_FEDBIOT_SUITE, models={"large": LARGE_DEEP})

PRESETS: Final[dict[str, Preset]] = {
    "default": _DEFAULT,
    "deep": _DEEP,
    "ci": _CI,
    "fedbiot": _FEDBIOT,
}


def get_preset(name: str) -> Preset:
    """The named preset.

    Raises:
        ConfigError: On an unknown name.
    """
    if name not in PRESETS:
        raise ConfigError(
            f"unknown benchmark preset {name!r}", fix=f"Use one of: {', '.join(PRESETS)}."
        )
    return PRESETS[name]
