"""Build the self-contained InferenceService schema shipped in ``schemas/``.

The chart tests keep the source schema (``tests/charts/schemas/inferenceservice-v1beta1.json``):
KServe's CRD is not among kubernetes-validate's schemas, so the project keeps the subset it
renders, with Kubernetes types referenced from kubernetes-validate's ``_definitions.json``.
``fedtune promote`` validates at run time, where kubernetes-validate (a dev dependency) is not
installed, so this module copies the referenced Kubernetes definitions (and everything they
reference) into the schema's own ``$defs``, without their descriptions.

Regenerate after changing the source schema (a test fails until the two agree)::

    python -m fedtune.serving.schema_bundle
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

K8S_DEFS_URI = "https://kubernetes.io/api/_definitions.json"
KUBE_VERSION = "1.35"  # the Kubernetes minor the chart tests render and validate for
SOURCE = Path("tests/charts/schemas/inferenceservice-v1beta1.json")
TARGET = Path(__file__).with_name("schemas") / "inferenceservice-v1beta1.json"

# Maps whose keys are names chosen by the schema's author, not schema keywords.
_NAME_MAPS = ("properties", "$defs", "patternProperties", "dependentSchemas")


def _walk_refs(node: Any, found: list[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            found.append(ref)
        for value in node.values():
            _walk_refs(value, found)
    elif isinstance(node, list):
        for item in node:
            _walk_refs(item, found)


def _strip_descriptions(node: Any, *, in_name_map: bool = False) -> Any:
    # A "description" key is a keyword in a schema but a field name inside "properties".
    if isinstance(node, dict):
        return {
            key: _strip_descriptions(value, in_name_map=key in _NAME_MAPS and not in_name_map)
            for key, value in node.items()
            if in_name_map or key != "description"
        }
    if isinstance(node, list):
        return [_strip_descriptions(item) for item in node]
    return node


def _local(ref: str) -> str:
    return "#/$defs/" + ref.split("#/$defs/", 1)[1]


def _relink(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: _relink(v) for k, v in node.items()}
        ref = out.get("$ref")
        if isinstance(ref, str) and ref.startswith(K8S_DEFS_URI + "#/$defs/"):
            out["$ref"] = _local(ref)
        return out
    if isinstance(node, list):
        return [_relink(item) for item in node]
    return node


def bundle(schema: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its Kubernetes references resolved into its own ``$defs``.

    Args:
        schema: The source schema, referencing ``K8S_DEFS_URI#/$defs/<name>``.
        definitions: kubernetes-validate's ``_definitions.json`` for the target version.

    Returns:
        A schema with no external references.
    """
    found: list[str] = []
    _walk_refs(schema, found)
    todo = [r.split("#/$defs/", 1)[1] for r in found if r.startswith(K8S_DEFS_URI)]
    wanted: dict[str, Any] = {}
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        wanted[name] = _strip_descriptions(definitions["$defs"][name])
        inner: list[str] = []
        _walk_refs(wanted[name], inner)
        todo.extend(r.removeprefix("#/$defs/") for r in inner if r.startswith("#/$defs/"))
    out: dict[str, Any] = _relink(schema)
    out["$defs"] = {**out.get("$defs", {}), **dict(sorted(wanted.items()))}
    return out


def kubernetes_definitions(minor: str = KUBE_VERSION) -> dict[str, Any]:
    """kubernetes-validate's strict definitions for ``minor`` (needs the dev dependency)."""
    from importlib.resources import files

    path = (
        files("kubernetes_validate")
        / "kubernetes-json-schema"
        / f"v{minor}.0-local-strict"
        / "_definitions.json"
    )
    definitions: dict[str, Any] = json.loads(path.read_text())
    return definitions


def render(schema: dict[str, Any]) -> str:
    """The file text: stable key order, one trailing newline."""
    return json.dumps(schema, indent=1, sort_keys=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Write the bundled schema next to this module."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=SOURCE, help="source schema (repo path)")
    parser.add_argument("--out", type=Path, default=TARGET, help="where to write the bundle")
    args = parser.parse_args(argv)
    source = json.loads(args.source.read_text(encoding="utf-8"))
    args.out.write_text(render(bundle(source, kubernetes_definitions())), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
