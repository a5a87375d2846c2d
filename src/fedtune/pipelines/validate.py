"""Strict checks of a compiled pipeline file: what the KFP backend and UI will accept.

A compiled file holds a PipelineSpec document and, when kfp-kubernetes settings are used, a
PlatformSpec document. ``ParseDict`` into the protobuf messages rejects any unknown field, and
kfp must be able to load the file back as a component.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from fedtune.core.errors import ConfigError


def validate_compiled(path: str | Path) -> dict[str, Any]:
    """Parse ``path`` strictly and load it with kfp; return ``{"pipeline_spec", "platform_spec"}``.

    Raises:
        ConfigError: The file is not a valid compiled pipeline.
    """
    from kfp import components

    path = Path(path)
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text("utf-8")) if d is not None]
        if not 1 <= len(docs) <= 2:
            raise ValueError(f"expected 1 or 2 YAML documents, found {len(docs)}")
        pipeline = json_format.ParseDict(docs[0], pipeline_spec_pb2.PipelineSpec())
        platform = (
            json_format.ParseDict(docs[1], pipeline_spec_pb2.PlatformSpec())
            if len(docs) == 2
            else None
        )
        components.load_component_from_file(str(path))
    except (OSError, ValueError, yaml.YAMLError, json_format.ParseError) as exc:
        raise ConfigError(
            f"{path} is not a valid compiled pipeline: {exc}",
            fix="Recompile it with `fedtune compile JOB.yaml -o PIPELINE.yaml`.",
        ) from None
    return {"pipeline_spec": pipeline, "platform_spec": platform}
