"""Which image each pipeline step runs, and retargeting a compiled pipeline to other images.

The references themselves (registry, CPU and GPU image, digests) are :mod:`fedtune.core.images`.
The heavy provider steps run the GPU image when the job's ``provider.gpu`` is above 0
(:func:`heavy_step_image`). Components are declared with the default references;
:func:`retarget` rewrites a compiled pipeline to other ones, so that one setting reaches every
task image and the launcher's tenant image: ``fedtune compile --image-registry REG
[--cpu-digest D] [--gpu-digest D]``, and the Helm chart's upload Job with the chart's
``image.*`` values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fedtune.core.images import TENANT_IMAGE_ENV, Images, provider_image, tenant_image

if TYPE_CHECKING:
    from fedtune.config.job import ProviderResources


def heavy_step_image(provider: ProviderResources) -> str:
    """The image of the heavy provider steps: the job's ``provider.image`` if set, else the
    GPU image when they request GPUs, else the CPU image (default references; see
    :func:`retarget`)."""
    if provider.image:
        return provider.image
    return tenant_image() if provider.gpu > 0 else provider_image()


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
