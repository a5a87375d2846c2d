"""Image references of the pipeline steps: one registry setting, digests preferred.

Two images: the CPU image runs the light KFP tasks (configure-round, close-rounds,
record-audit, and the tenant launcher, which only talks to the Kubernetes API) and the heavy
provider steps of a job that asks for no GPU; the GPU image runs the tenant trainer the
launcher starts in tenant namespaces and the heavy provider steps of a job whose
``provider.gpu`` is above 0 (:func:`heavy_step_image`). Both are built from the same release.

Components are declared with the default references (``ghcr.io/fedtune/fedtune-cpu:<version>``);
:func:`retarget` rewrites a compiled pipeline to other ones, so that one setting reaches every
task image and the launcher's tenant image: ``fedtune compile --image-registry REG
[--cpu-digest D] [--gpu-digest D]``, and the Helm chart's upload Job with the chart's
``image.*`` values. A digest, when given, pins the image (``repo@sha256:...``), which is what
tenant namespaces' admission policies admit; a tag (the package version) is the fallback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedtune.config.job import ProviderResources

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


def heavy_step_image(provider: ProviderResources) -> str:
    """The image of the heavy provider steps: the job's ``provider.image`` if set, else the
    GPU image when they request GPUs, else the CPU image (default references; see
    :func:`retarget`)."""
    if provider.image:
        return provider.image
    return tenant_image() if provider.gpu > 0 else provider_image()


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


def retarget(spec: dict[str, Any], images: Images) -> int:
    """Point every executor of a compiled PipelineSpec (``spec``, changed in place) that runs
    a default fedtune image at ``images``, and the launcher's tenant image with it; return
    how many references changed. A job's own ``provider.image`` is left as it is."""
    mapping = {provider_image(): images.cpu, tenant_image(): images.gpu}
    changed = 0
    executors = (spec.get("deploymentSpec") or {}).get("executors") or {}
    for executor in executors.values():
        container = executor.get("container") or {}
        if container.get("image") in mapping:
            new = mapping[container["image"]]
            changed += new != container["image"]
            container["image"] = new
        for item in container.get("env") or []:
            if item.get("name") == TENANT_IMAGE_ENV and item.get("value") in mapping:
                new = mapping[item["value"]]
                changed += new != item["value"]
                item["value"] = new
    return changed


def retarget_text(text: str, images: Images) -> str:
    """A compiled pipeline's YAML with :func:`retarget` applied to its PipelineSpec; the
    compiler's header comment and any PlatformSpec are kept, written as the compiler writes
    them (sorted keys)."""
    import yaml

    lines = text.splitlines()
    leading = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    header = "".join(line + "\n" for line in lines[:leading])
    # libyaml where present: a pipeline is ~100 KB, which the pure-Python parser takes ~1 s for.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    documents = list(yaml.load_all(text, Loader=loader))  # a safe loader (C or Python)
    if images.is_default or retarget(documents[0], images) == 0:
        return text
    return header + yaml.dump_all(documents, Dumper=dumper, sort_keys=True)
