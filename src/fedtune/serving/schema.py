"""Strict validation of a rendered InferenceService against the schema shipped with fedtune.

The schema (``schemas/inferenceservice-v1beta1.json``) is the subset of KServe's
``serving.kserve.io/v1beta1`` InferenceService the chart and ``fedtune promote`` render, with
the Kubernetes types it uses copied in (see :mod:`fedtune.serving.schema_bundle`). Unknown
fields are rejected, so a typo fails here instead of being pruned by the API server.
"""

from __future__ import annotations

import functools
import json
from importlib.resources import files
from typing import Any

from fedtune.core.errors import ConfigError

SCHEMA_FILE = "inferenceservice-v1beta1.json"


@functools.cache
def inferenceservice_schema() -> dict[str, Any]:
    """The bundled JSON schema (loaded once)."""
    text = (files("fedtune.serving") / "schemas" / SCHEMA_FILE).read_text(encoding="utf-8")
    return dict(json.loads(text))


def inferenceservice_problems(doc: dict[str, Any]) -> list[str]:
    """Every schema violation of ``doc`` as ``path: message`` lines (empty when valid)."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(inferenceservice_schema())
    problems = []
    for error in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        path = ".".join(str(p) for p in error.absolute_path) or "(document)"
        problems.append(f"{path}: {error.message}")
    return problems


def validate_inferenceservice(doc: dict[str, Any]) -> None:
    """Raise unless ``doc`` is a valid InferenceService of the supported subset.

    Raises:
        ConfigError: Listing every violation at once.
    """
    problems = inferenceservice_problems(doc)
    if problems:
        raise ConfigError(
            "the rendered InferenceService is invalid:\n  " + "\n  ".join(problems),
            fix="Correct the options named above (names must be DNS-1123 labels).",
        )
