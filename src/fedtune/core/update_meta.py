"""What a tenant may say about its update: a typed schema for ``Update.meta``.

An update's metadata crosses from a tenant to the provider and ends in the provider's
records (round summaries, MLflow). So it is a closed schema: counts and timings as numbers,
metrics as finite numbers under a bounded, declared set of keys (:data:`METRIC_KEYS`), and
no free text: where a tenant's step wants to tell the provider why something happened, it
sends one of the declared codes of :data:`TENANT_FLAGS`, and the provider's records show the
provider's own sentence for it. The provider validates every update against this schema
(:func:`check_update_meta`) and rejects one that does not fit, naming the tenant.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fedtune.core.errors import UpdateRejected

TENANT_FLAGS: dict[str, str] = {
    "fewfedpit/beta-one": "beta = 1: the upload is W^l (FedAvg's)",
    "fewfedpit/too-few-records": "synthetic data skipped: fewer local training records than "
    "instruction_demos (too_few_records: local-only)",
    "fewfedpit/no-candidate": "no synthetic candidate passed the filters; W^g stays the "
    "global adapter",
    "fewfedpit/too-long": "every kept synthetic example exceeds max_seq_len; W^g stays the "
    "global adapter",
    "dp-sgd/epsilon-shared": "example-level DP-SGD applied; its epsilon is in the dp_sgd/ "
    "metrics",
    "dp-sgd/epsilon-kept": "example-level DP-SGD applied (the tenant keeps its epsilon to "
    "itself)",
}
"""Every code a tenant's step may report, and the sentence the provider's records show."""

_FEWFEDPIT = ("instruction_prompts", "rejected_format", "rejected_similar_instruction",
              "rejected_unparsed", "rejected_similar_example", "candidates", "kept", "ifs_mean",
              "synthetic_train_loss", "synthetic_steps")
METRIC_KEYS: frozenset[str] = frozenset(
    {
        "bytes_down", "bytes_up",  # what a tenant received and sent (FedBiOT's family)
        "adapemu/eval_loss", "adapemu/exact_match",  # FedBiOT's AdapEmu
        *(f"fewfedpit/{k}" for k in _FEWFEDPIT),
        "public_ce",  # FedMKT's small model: its public CE and held-out scores
        *(f"eval/slm/{k}" for k in ("acc", "rouge_l", "n_choice", "n_generate")),
        *(f"slm_kd_{k}" for k in ("steps", "ce", "kd", "kd_rows")),
        *(f"dp_sgd/{k}" for k in ("epsilon", "delta", "noise_multiplier", "max_grad_norm",
                                  "sample_rate")),
    }
)
"""Every metric key a tenant's update may carry (a new metric is declared here first)."""

EVAL_KEYS: frozenset[str] = frozenset(
    {
        "eval_loss",  # the final model on the tenant's held-out split
        "adapemu/eval_loss", "adapemu/exact_match",  # FedBiOT's AdapEmu
        *(f"slm/{k}" for k in ("acc", "rouge_l", "n_choice", "n_generate")),  # FedMKT's kept model
    }
)
"""Every key a tenant's final evaluation may report."""

Finite = Annotated[float, Field(allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=2**62)]
Seconds = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Flag = Literal[tuple(TENANT_FLAGS)]  # type: ignore[valid-type]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class SecAggMeta(_Closed):
    """A masked update's clear facts (secure aggregation)."""

    weight: Finite
    unopened: list[Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)]] = Field(
        default_factory=list, max_length=10_000,
        description="Tenants whose shares this tenant could not open (names only; the reasons "
        "stay in the tenant's log).",
    )
    plain_bytes: Count


class DpMeta(_Closed):
    """Client-level DP with adaptive clipping: one bit, never the norm."""

    unclipped: bool


class UpdateMeta(_Closed):
    """Everything ``Update.meta`` may hold."""

    num_samples: int
    train_loss: Finite | None = None
    eval_loss: Finite | None = None
    steps: Count | None = None
    tokens: Count | None = None
    train_seconds: Seconds | None = None
    eval_seconds: Seconds | None = None
    package_version: Count | None = None
    package_received: Literal["delta", "full"] | None = None
    metrics: dict[str, Finite] = Field(default_factory=dict, max_length=len(METRIC_KEYS))
    # Flag is a Literal built from TENANT_FLAGS at import, which mypy cannot read as a type.
    flags: list[Flag] = Field(default_factory=list, max_length=len(TENANT_FLAGS))  # type: ignore[valid-type]
    secagg: SecAggMeta | None = None
    dp: DpMeta | None = None

    def notes(self) -> list[str]:
        """The provider's sentences for this update's flags."""
        return [TENANT_FLAGS[f] for f in self.flags]


def _int_floats(meta: dict[str, Any]) -> dict[str, Any]:
    """JSON has one number type: an integral float where a float is due is fine, and so is
    an int for a float (strict mode would refuse both)."""
    out = dict(meta)
    metrics = out.get("metrics")
    if isinstance(metrics, dict):
        out["metrics"] = {
            k: float(v) if isinstance(v, int) and not isinstance(v, bool) else v
            for k, v in metrics.items()
        }
    for key in ("train_loss", "eval_loss", "train_seconds", "eval_seconds"):
        v = out.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            out[key] = float(v)
    if isinstance(out.get("secagg"), dict) and isinstance(out["secagg"].get("weight"), int):
        out["secagg"] = {**out["secagg"], "weight": float(out["secagg"]["weight"])}
    return out


def parse_update_meta(meta: dict[str, Any]) -> UpdateMeta:
    """``meta`` as the schema reads it.

    Raises:
        ValueError: A key outside the schema or :data:`METRIC_KEYS`, or a value of the
            wrong type (text, NaN, Inf...), described without quoting any value.
    """
    try:
        parsed = UpdateMeta.model_validate(_int_floats(meta))
    except ValidationError as exc:
        # Field names of the schema only: an unknown key is the tenant's text.
        where = sorted({
            str(e["loc"][0]) if e["loc"] and e["loc"][0] in UpdateMeta.model_fields else "(unknown key)"
            for e in exc.errors()
        })
        raise ValueError(f"metadata field(s) {where} are not of the update schema") from None
    unknown = sorted(k for k in parsed.metrics if k not in METRIC_KEYS)
    if unknown:
        raise ValueError(f"{len(unknown)} metric key(s) outside the declared set")
    return parsed


def check_eval_metrics(tenant: str, metrics: Any) -> dict[str, float]:
    """The provider's check of a tenant's final evaluation: finite numbers under
    :data:`EVAL_KEYS`.

    Raises:
        UpdateRejected: Naming the tenant and how many keys or values do not fit (never
            the keys or values themselves).
    """
    fits = isinstance(metrics, dict) and len(metrics) <= len(EVAL_KEYS)
    if fits:
        unknown = [k for k in metrics if k not in EVAL_KEYS]
        bad = [k for k, v in metrics.items() if k in EVAL_KEYS and not _finite(v)]
        fits = not unknown and not bad
    if not fits:
        raise UpdateRejected(
            f"tenant {tenant!r}: final evaluation rejected: it must map declared keys to finite "
            "numbers (fedtune.core.update_meta.EVAL_KEYS)",
            fix="Run the same fedtune version as the provider; a tenant reports numbers only.",
        )
    return {k: float(v) for k, v in metrics.items()}


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_update_meta(tenant: str, meta: dict[str, Any]) -> UpdateMeta:
    """The provider's check of a tenant's update metadata.

    Raises:
        UpdateRejected: Naming the tenant and what does not fit (never the values: they are
            the tenant's text).
    """
    try:
        return parse_update_meta(meta)
    except ValueError as exc:
        raise UpdateRejected(
            f"tenant {tenant!r}: update rejected: {exc}",
            fix="A tenant reports numbers under the declared keys only "
            "(fedtune.core.update_meta.METRIC_KEYS) and flags from TENANT_FLAGS; run the same "
            "fedtune version as the provider.",
        ) from None
