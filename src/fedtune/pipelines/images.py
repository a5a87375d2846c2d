"""Image references of the pipeline steps, tagged with the installed package version.

Two images: the CPU image runs the light KFP tasks (configure-round, close-rounds,
record-audit, and the tenant launcher, which only talks to the Kubernetes API) and the heavy
provider steps of a job that asks for no GPU; the GPU image runs the tenant trainer the
launcher starts in tenant namespaces and the heavy provider steps of a job whose
``provider.gpu`` is above 0 (:func:`heavy_step_image`). Both are built from the same release,
so a compiled pipeline always names the images of the code that compiled it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedtune.config.job import ProviderResources

REGISTRY = "ghcr.io/fedtune"


def _version(version: str | None) -> str:
    from fedtune import __version__

    return version or __version__


def provider_image(version: str | None = None) -> str:
    """``ghcr.io/fedtune/fedtune-cpu:<version>``: the CPU image every KFP task runs by default."""
    return f"{REGISTRY}/fedtune-cpu:{_version(version)}"


def tenant_image(version: str | None = None) -> str:
    """``ghcr.io/fedtune/fedtune-gpu:<version>``: the GPU image (tenant trainer, GPU steps)."""
    return f"{REGISTRY}/fedtune-gpu:{_version(version)}"


def heavy_step_image(provider: ProviderResources) -> str:
    """The image of the heavy provider steps: the job's ``provider.image`` if set, else the
    GPU image when they request GPUs, else the CPU image."""
    if provider.image:
        return provider.image
    return tenant_image() if provider.gpu > 0 else provider_image()
