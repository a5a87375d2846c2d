"""The machine-readable run summary (``--summary-json``): one record per round.

Other engines and algorithms extend the same structure: a top-level ``rounds`` list, the
final artifacts' URIs and the MLflow run id.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from fedtune.config.job import JobConfig
from fedtune.core.update_meta import UpdateMeta, parse_update_meta


@dataclass
class RoundRecord:
    """What one round did, per tenant and per phase."""

    round: int
    sampled: list[str]
    tenants: dict[str, dict[str, Any]]
    wall_time: dict[str, Any]
    accepted: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)
    train_loss: float | None = None
    eval_loss: float | None = None
    server_metrics: dict[str, float] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        round_index: int,
        sampled: list[str],
        configure: dict[str, Any],
        clients: dict[str, dict[str, Any]],
        aggregate: dict[str, Any],
        total_seconds: float,
    ) -> RoundRecord:
        """Assemble a record from the step results of one round."""
        tenants: dict[str, dict[str, Any]] = {}
        for name in sampled:
            result = clients.get(name, {})
            meta = _typed(result.get("meta"))
            notes = [*meta.notes(), *result.get("provider_notes", [])] if meta else list(
                result.get("provider_notes", [])
            )
            tenants[name] = {
                "train_loss": meta.train_loss if meta else None,
                "eval_loss": meta.eval_loss if meta else None,
                "num_samples": meta.num_samples if meta else None,
                # From the provider's side: the broadcast goes out, the update comes in.
                "bytes_sent": configure.get("bytes", 0),
                "bytes_received": result.get("bytes", 0),
                "raw_update_bytes": result.get("raw_bytes"),
                "client_seconds": result.get("seconds"),
                "train_seconds": meta.train_seconds if meta else None,
                "eval_seconds": meta.eval_seconds if meta else None,
                # Algorithm-specific tenant metrics (e.g. FedBiOT's AdapEmu scores, bytes),
                # numbers under declared keys only (fedtune.core.update_meta).
                "metrics": dict(meta.metrics) if meta else {},
                # The provider's sentences for the codes the tenant reported, and its own
                # notes (secure aggregation's offenders); never a tenant's text.
                **({"notes": notes} if notes else {}),
            }
        return cls(
            round=round_index,
            sampled=sampled,
            tenants=tenants,
            wall_time={
                "configure": configure.get("seconds", 0.0),
                "clients": {n: clients.get(n, {}).get("seconds", 0.0) for n in sampled},
                "aggregate": aggregate.get("seconds", 0.0),
                "aggregate_compute": aggregate.get("compute_seconds", 0.0),
                "total": total_seconds,
            },
            accepted=list(aggregate.get("accepted", [])),
            rejected=dict(aggregate.get("rejected", {})),
            train_loss=aggregate.get("train_loss"),
            eval_loss=aggregate.get("eval_loss"),
            server_metrics=dict(aggregate.get("metrics") or {}),
        )

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (NaN becomes null so every JSON reader accepts it)."""
        return _clean(asdict(self))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RoundRecord:
        """Inverse of :meth:`to_json`."""
        return cls(**data)

    def metrics(self) -> dict[str, float]:
        """Flat metrics for the tracker: aggregate and per tenant."""
        out: dict[str, float] = {
            "clients_accepted": float(len(self.accepted)),
            "clients_rejected": float(len(self.rejected)),
            "round_seconds": float(self.wall_time["total"]),
        }
        if self.train_loss is not None:
            out["train_loss"] = self.train_loss
        if self.eval_loss is not None:
            out["eval_loss"] = self.eval_loss
        for tenant, values in self.tenants.items():
            for key in ("train_loss", "eval_loss", "bytes_sent", "bytes_received"):
                value = values.get(key)
                if isinstance(value, int | float) and math.isfinite(value):
                    out[f"{key}/{tenant}"] = float(value)
            for key, value in (values.get("metrics") or {}).items():
                if isinstance(value, int | float) and math.isfinite(value):
                    out[f"{key}/{tenant}"] = float(value)
        for key, value in self.server_metrics.items():
            if isinstance(value, int | float) and math.isfinite(value):
                out[f"server/{key}"] = float(value)
        return out


def _typed(meta: Any) -> UpdateMeta | None:
    """A tenant's update metadata as the schema reads it; None where it does not fit (the
    update was rejected for it) or there is none."""
    if not isinstance(meta, dict) or not meta:
        return None
    try:
        return parse_update_meta(meta)
    except ValueError:
        return None


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def build_summary(
    job: JobConfig,
    rounds: list[RoundRecord],
    *,
    run_id: str,
    completed: bool,
    artifacts: dict[str, Any] | None = None,
    final_eval: dict[str, Any] | None = None,
    run_info: dict[str, Any] | None = None,
    audit: dict[str, Any] | None = None,
    warnings: list[str] | None = None,
) -> dict[str, Any]:
    """The whole summary document.

    ``run_info`` holds facts an algorithm established when it initialised (e.g. FedBiOT's
    ``emulator_layers`` and ``adapter_layers``); they appear at the top level. ``warnings``
    name what the preflight found weak (a tenant with fewer records than a batch).
    """
    return _clean(
        {
            **(run_info or {}),
            "job": job.name,
            "algorithm": job.algorithm.name,
            "completed": completed,
            "mlflow_run_id": run_id,
            "rounds": [r.to_json() for r in rounds],
            "final_eval": final_eval or {},
            "artifacts": artifacts or {},
            **({"audit": audit} if audit else {}),
            "warnings": warnings or [],
        }
    )
