"""The release's image references: one registry, two images, digests preferred.

The CPU image runs the light KFP tasks and the provider steps of a job that asks for no GPU;
the GPU image runs the tenant trainer the launcher starts in tenant namespaces and the GPU
provider steps. Both are built from the same release. A digest, when given, pins the image
(``repo@sha256:...``), which is what tenant namespaces' admission policies admit; a tag (the
package version) is the fallback. Here, below the engines and the pipelines, because both name
them: the pipelines declare their components with them, the launcher its tenant pods.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

REGISTRY = "ghcr.io/fedtune"
CPU_NAME = "fedtune-cpu"
GPU_NAME = "fedtune-gpu"
TENANT_IMAGE_ENV = "FEDTUNE_TENANT_IMAGE"
"""Set on launcher tasks: the image of the tenant Jobs when the chart's tenants file names none."""

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_REGISTRY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$")


def _version(version: str | None) -> str:
    from fedtune import __version__

    return version or __version__


def image_ref(registry: str, name: str, version: str | None = None, digest: str | None = None) -> str:
    """``registry/name@digest`` when a digest is given, else ``registry/name:version``.

    Raises:
        ValueError: A registry or digest that is not well formed (the message says which).
    """
    if not _REGISTRY.match(registry):
        raise ValueError(
            f"image registry {registry!r} is not a registry path such as ghcr.io/fedtune or "
            "registry.example.com:5000/mirror/fedtune (no scheme, no trailing slash)"
        )
    if digest:
        if not _DIGEST.match(digest):
            raise ValueError(f"image digest {digest!r} is not sha256:<64 lowercase hex digits>")
        return f"{registry}/{name}@{digest}"
    return f"{registry}/{name}:{_version(version)}"


def provider_image(version: str | None = None) -> str:
    """``ghcr.io/fedtune/fedtune-cpu:<version>``: the CPU image every KFP task runs by default."""
    return image_ref(REGISTRY, CPU_NAME, version)


def tenant_image(version: str | None = None) -> str:
    """``ghcr.io/fedtune/fedtune-gpu:<version>``: the GPU image (tenant trainer, GPU steps)."""
    return image_ref(REGISTRY, GPU_NAME, version)


@dataclass(frozen=True)
class Images:
    """The two images a compiled pipeline should run."""

    cpu: str
    gpu: str

    @classmethod
    def of(
        cls,
        registry: str = REGISTRY,
        *,
        version: str | None = None,
        cpu_digest: str | None = None,
        gpu_digest: str | None = None,
    ) -> Images:
        """The images of ``registry``, each by digest when one is given, else by tag."""
        return cls(
            cpu=image_ref(registry, CPU_NAME, version, cpu_digest),
            gpu=image_ref(registry, GPU_NAME, version, gpu_digest),
        )

    @property
    def is_default(self) -> bool:
        """True when these are the references the components are declared with."""
        return (self.cpu, self.gpu) == (provider_image(), tenant_image())
