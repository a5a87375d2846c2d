"""Image references of the pipeline steps, tagged with the installed package version.

One image per runtime role: the CPU image runs every KFP task (provider steps, and the tenant
launcher, which only talks to the Kubernetes API); the GPU image is the tenant trainer the
launcher starts in tenant namespaces. Both are built from the same release, so a compiled
pipeline always names the images of the code that compiled it.
"""

from __future__ import annotations

REGISTRY = "ghcr.io/fedtune"


def _version(version: str | None) -> str:
    from fedtune import __version__

    return version or __version__


def provider_image(version: str | None = None) -> str:
    """``ghcr.io/fedtune/fedtune-cpu:<version>``: every KFP task runs in it."""
    return f"{REGISTRY}/fedtune-cpu:{_version(version)}"


def tenant_image(version: str | None = None) -> str:
    """``ghcr.io/fedtune/fedtune-gpu:<version>``: the trainer launched in tenant namespaces."""
    return f"{REGISTRY}/fedtune-gpu:{_version(version)}"
