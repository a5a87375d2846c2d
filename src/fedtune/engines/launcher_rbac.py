"""The namespaced RBAC rules of the pipeline run's ServiceAccount (the launcher's).

One ServiceAccount runs every task of a fedtune pipeline run (the chart's
``<release>-fedtune-launcher``, picked as the run's service account in the KFP UI or with
``fedtune submit --service-account``). It needs two sets of rules, nothing more:
:data:`LAUNCHER_RULES` in each tenant namespace and :func:`kfp_run_rules` in the provider
namespace, where the run's pods live.

A KFP task always runs in the run's namespace, so the client step is a launcher that creates a
``batch/v1`` Job in the tenant's namespace and waits for it. It never reads the pod's log:
a tenant's log may quote its records, and what the provider learns of a failure is the
redacted termination message in the pod's status (fedtune.core.errors.TenantFailure). These are exactly
the permissions that takes, and nothing more: no cluster-wide access, and no reading of
Secrets (the launched pod mounts the tenant's bucket Secret itself, so the provider never
reads it). The launcher only *creates* one Secret per Job, the Job's pre-signed URLs, owned by
the Job; to give it the Job's uid it creates the Job suspended and resumes it (``patch``), see
:func:`fedtune.engines.launcher.launch`. ``create`` cannot read or change an existing Secret,
and the tenant's admission policy admits only a Secret named after a Job and owned by it.

The Helm chart renders these rules into one Role per tenant, and the chart tests check that
every rendered Role equals :data:`LAUNCHER_RULES`; change them here and in
``charts/fedtune/templates/tenant-role.yaml`` together.
"""

from __future__ import annotations

from typing import Final

LAUNCHER_RULES: Final[list[dict[str, list[str]]]] = [
    # Create the tenant's training Job (suspended), resume it once its URL Secret exists,
    # follow it to completion, clean it up afterwards.
    {
        "apiGroups": ["batch"],
        "resources": ["jobs"],
        "verbs": ["create", "get", "list", "watch", "patch", "delete"],
    },
    # The Job's pre-signed URLs, in a Secret owned by the Job: create only, never read.
    {
        "apiGroups": [""],
        "resources": ["secrets"],
        "verbs": ["create"],
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


KFP_LAUNCHER_CONFIGMAP: Final = "kfp-launcher"
"""KFP v2's per-namespace launcher settings (pipeline root, object-store provider)."""
KFP_ARTIFACT_SECRET: Final = "mlpipeline-minio-artifact"
"""The object-store Secret Kubeflow syncs into every profile namespace for KFP's artifacts."""


def kfp_run_rules(
    launcher_config_map: str = KFP_LAUNCHER_CONFIGMAP,
    artifact_secrets: tuple[str, ...] = (KFP_ARTIFACT_SECRET,),
    *,
    argo_before_v34: bool = False,
) -> list[dict[str, list[str]]]:
    """What KFP v2 and Argo do as the run's ServiceAccount in the run's namespace.

    Sources: Argo Workflows' "Workflow RBAC" page (docs/workflow-rbac.md: the executor's
    minimum is ``workflowtaskresults`` create and patch; executors before v3.4 instead get,
    watch and patch their own pod) and Kubeflow Pipelines' ``pipeline-runner`` role
    (manifests/kustomize/base/pipeline/pipeline-runner-role.yaml), narrowed to what the v2
    driver and launcher read: the ``kfp-launcher`` ConfigMap and the artifact store's Secret
    (``get`` only, by name). The upstream role grants far more (pods/exec, services, Jobs,
    Deployments, every Secret): fedtune's tasks need none of it, so none of it is here.
    Everything a fedtune task itself reads in this namespace (tenants file, store and
    presigner Secrets) is mounted by the kubelet, which needs no right of the ServiceAccount.

    Args:
        launcher_config_map: Name of KFP's launcher ConfigMap in the run's namespace.
        artifact_secrets: Names of the artifact-store Secrets KFP's launcher reads.
        argo_before_v34: Also grant pods get/watch/patch, which only Argo executors before
            v3.4 use. Off by default: patching pods would let a run change the MinIO or
            MLflow pod of the namespace (a container's image is mutable), and with them
            reach the object store's root credentials.
    """
    rules: list[dict[str, list[str]]] = [
        # Argo's executor (wait container) reports each task's outputs.
        {
            "apiGroups": ["argoproj.io"],
            "resources": ["workflowtaskresults"],
            "verbs": ["create", "patch"],
        },
    ]
    if argo_before_v34:
        # Argo's executor before v3.4 reads and annotates its own pod instead.
        rules.append({"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "watch", "patch"]})
    return [
        *rules,
        # KFP v2's driver and launcher: settings and artifact-store credentials, by name.
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [launcher_config_map],
            "verbs": ["get"],
        },
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": list(artifact_secrets),
            "verbs": ["get"],
        },
    ]
