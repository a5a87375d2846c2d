"""The job configs the benchmarks run: one place that turns benchmark settings into a job."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

from fedtune.config import parse_job
from fedtune.config.algorithms import tenants_load_base
from fedtune.config.job import JobConfig

__all__ = ["ALL_LINEAR", "TrainingSettings", "bench_job"]

# LoRA on every linear layer of a Llama: q/v-only adapters barely move a tiny model
# (measured; see docs/benchmarks.md).
ALL_LINEAR: Final[tuple[str, ...]] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)


class TrainingSettings(Protocol):
    """The training fields both benchmark specs carry."""

    @property
    def batch_size(self) -> int: ...
    @property
    def lr(self) -> float: ...
    @property
    def optimizer(self) -> str: ...
    @property
    def max_seq_len(self) -> int: ...
    @property
    def lora_r(self) -> int: ...
    @property
    def lora_alpha(self) -> float: ...
    @property
    def lora_targets(self) -> tuple[str, ...] | None: ...
    @property
    def algorithm_params(self) -> Mapping[str, Mapping[str, Any]]: ...


def bench_job(
    settings: TrainingSettings,
    *,
    name: str,
    algorithm: str,
    model_dir: Path,
    suite_dir: Path,
    tenants: Sequence[str],
    workdir: Path,
    seed: int,
    rounds: int,
    local_steps: int,
    algorithm_overrides: Mapping[str, Any] | None = None,
    data_dir: Path | None = None,
    clients_per_round: int | None = None,
    tenant_model_dir: Path | Mapping[str, Path] | None = None,
    differential_privacy: Mapping[str, Any] | None = None,
    training_overrides: Mapping[str, Any] | None = None,
    public_path: Path | None = None,
) -> JobConfig:
    """A validated job on the suite's tenant files, from the pretrained model, untracked.

    No tenant data is held out (``eval_fraction: 0``): the benchmarks score on the suite's
    own test set. Tenant ``central`` is the pooled data of the Centralized baseline. The
    tenants' files are read from ``data_dir`` (default: the suite; the few-shot split has
    its own folder), the public set from ``public_path`` (default: the suite's).
    ``tenant_model_dir``: every tenant's own small model (FedMKT), a pretrained folder with
    its tokenizer, or one per tenant name.
    ``differential_privacy``: the job's DP section (DP-FedAvg methods), or None.
    ``training_overrides``: more training fields (e.g. device, precision,
    gradient_checkpointing), over the settings'.
    """
    params = dict(settings.algorithm_params.get(algorithm, {})) | dict(algorithm_overrides or {})
    if algorithm == "scaffold" and settings.optimizer != "sgd":
        # The recorded tables compare every method with the same AdamW clients; SCAFFOLD is
        # defined for SGD clients, so the comparison opts in explicitly (and says so).
        params.setdefault("allow_non_sgd_optimizer", True)
    model: dict[str, Any] = {"source": "pretrained", "uri": str(model_dir.resolve())}
    tenant_dirs = (
        dict(tenant_model_dir)
        if isinstance(tenant_model_dir, Mapping)
        else dict.fromkeys(tenants, tenant_model_dir)
    )
    if tenants_load_base(algorithm):
        # The benchmark's base is public to every party: FedIT tenants read the same folder.
        model["tenant_uri"] = model["uri"]
    return parse_job(
        {
            "name": name,
            "seed": seed,
            "workdir": str(workdir),
            "model": model,
            "algorithm": {"name": algorithm, **params},
            "rounds": rounds,
            "clients_per_round": clients_per_round,
            "min_clients": 1,
            "training": {
                "local_steps": local_steps,
                "batch_size": settings.batch_size,
                "lr": settings.lr,
                "optimizer": settings.optimizer,
                "max_seq_len": settings.max_seq_len,
                "eval_fraction": 0.0,
            }
            | dict(training_overrides or {}),
            "lora": {
                "r": settings.lora_r,
                "alpha": settings.lora_alpha,
                "target_modules": list(settings.lora_targets) if settings.lora_targets else None,
            },
            "tenants": [
                {"name": t, "data_uri": str(((data_dir or suite_dir) / f"{t}.jsonl").resolve())}
                | (
                    {"model": {"source": "pretrained", "uri": str(own.resolve())}}
                    if (own := tenant_dirs.get(t)) is not None
                    else {}
                )
                for t in tenants
            ],
            "public_data_uri": str((public_path or suite_dir / "public.jsonl").resolve()),
            "tracking": {"backend": "none"},
            "differential_privacy": dict(differential_privacy) if differential_privacy else None,
            # The quality benchmark scores the global model of several rounds after the run.
            "storage": {"state_retention": rounds + 1},
        },
        source=f"benchmark job {name}",
    )
