"""The namespaced RBAC rules the tenant launcher needs in each tenant namespace.

A KFP task always runs in the run's namespace, so the client step is a launcher that creates a
``batch/v1`` Job in the tenant's namespace and waits for it. It never reads the pod's log:
a tenant's log may quote its records, and what the provider learns of a failure is the
redacted termination message in the pod's status (fedtune.core.errors.TenantFailure). These are exactly
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
    # Find the Job's pod and read its status (exit code, termination message); read-only.
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["get", "list", "watch"],
    },
    # The Job's events: why its pods cannot be created (quota, admission); read-only.
    {
        "apiGroups": [""],
        "resources": ["events"],
        "verbs": ["list"],
    },
]
