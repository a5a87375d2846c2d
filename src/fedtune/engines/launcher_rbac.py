"""The namespaced RBAC rules the tenant launcher needs in each tenant namespace.

A KFP task always runs in the run's namespace, so the client step is a launcher that creates a
``batch/v1`` Job in the tenant's namespace, waits for it and reads its logs. These are exactly
the permissions that takes, and nothing more: no Secrets (the launched pod mounts the tenant's
bucket Secret itself, so the provider never reads it), no cluster-wide access.

The Helm chart renders these rules into one Role per tenant, and the chart tests check that
every rendered Role equals :data:`LAUNCHER_RULES`; change them here and in
``charts/fedtune/templates/tenant-role.yaml`` together.
"""

from __future__ import annotations

from typing import Final

LAUNCHER_RULES: Final[list[dict[str, list[str]]]] = [
    # Create the tenant's training Job, follow it to completion, clean it up afterwards.
    {
        "apiGroups": ["batch"],
        "resources": ["jobs"],
        "verbs": ["create", "get", "list", "watch", "delete"],
    },
    # Find the Job's pod and stream its log into the KFP task's log; read-only.
    {
        "apiGroups": [""],
        "resources": ["pods", "pods/log"],
        "verbs": ["get", "list", "watch"],
    },
]
