"""The tenant steps by kind: one dispatch shared by the worker pool, the launcher's
in-process path and a launched tenant pod."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from fedtune.engines.tenant.env import TenantEnv

TenantKind = Literal["client", "evaluate", "audit", "secagg-advertise", "secagg-share", "secagg-unmask"]
"""A step that runs on a tenant's side: a round's training, the final evaluation, the audit,
and the extra steps of a secure-aggregation round."""


def run_tenant_task(env: TenantEnv, kind: TenantKind, round_index: int) -> dict[str, Any]:
    """Run one tenant step against ``env``; return its result (see each step)."""
    from fedtune.engines.tenant import steps

    if kind.startswith("secagg-") or (kind == "client" and env.job.secure_aggregation is not None):
        from fedtune.engines.tenant import secagg as secagg_steps

        return secagg_steps.TENANT_STEPS[kind](env, round_index)
    if kind == "client":
        return steps.client_step(env, round_index)
    if kind == "audit":
        from fedtune.engines.tenant.audit import audit_step

        return audit_step(env)
    return {"metrics": steps.evaluate_step(env)}


def failure_tag(kind: TenantKind, round_index: int) -> str:
    """Name of the tenant's private error file for a failed step (``errors/<tag>.txt``)."""
    from fedtune.engines import layout  # here: the worker pool imports this module before torch

    if kind.startswith("secagg-"):
        return f"{layout.round_tag(round_index)}-{kind}"
    return layout.round_tag(round_index) if kind == "client" else kind
