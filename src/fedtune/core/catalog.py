"""The registered algorithms read from their source, without importing them.

Importing an algorithm imports torch, transformers and peft (seconds); ``fedtune
algorithms`` only needs each name and the first line of its class docstring. A class marked
``@register`` answers to the names of the config section it is parameterised with
(``class FedAvg(LoraFedAlgorithm[FedAvgConfig])``), and that section states them as its
``name: Literal[...]`` in the package's ``config.py``: both read plainly from the source. A test
checks this catalog against the registry that the imports fill.
"""

from __future__ import annotations

import ast
from importlib import resources
from pathlib import Path


def algorithm_catalog() -> dict[str, str]:
    """Every registered algorithm name and the first line of its class docstring, sorted."""
    found: dict[str, str] = {}
    root = resources.files("fedtune") / "algorithms"
    with resources.as_file(root) as folder:
        for config in sorted(folder.glob("*/config.py")):
            names = _section_names(_parse(config))
            for path in sorted(config.parent.rglob("*.py")):
                for node in ast.walk(_parse(path)):
                    if isinstance(node, ast.ClassDef) and _registered(node):
                        first = ((ast.get_docstring(node) or "").strip().splitlines() or [""])[0]
                        for name in names.get(_section_of(node) or "", ()):
                            found[name] = first
    return dict(sorted(found.items()))


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _section_names(tree: ast.Module) -> dict[str, tuple[str, ...]]:
    """Each config class of a module and the names of its ``name: Literal[...]`` field."""
    sections: dict[str, tuple[str, ...]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if (
                isinstance(item, ast.AnnAssign)
                and isinstance(item.target, ast.Name)
                and item.target.id == "name"
                and isinstance(item.annotation, ast.Subscript)
            ):
                values = item.annotation.slice
                elements = values.elts if isinstance(values, ast.Tuple) else [values]
                sections[node.name] = tuple(
                    e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)
                )
    return sections


def _registered(node: ast.ClassDef) -> bool:
    for decorator in node.decorator_list:
        called = decorator.id if isinstance(decorator, ast.Name) else getattr(decorator, "attr", None)
        if called == "register":
            return True
    return False


def _section_of(node: ast.ClassDef) -> str | None:
    """``FedAvgConfig`` of ``class FedAvg(LoraFedAlgorithm[FedAvgConfig])``."""
    for base in node.bases:
        if isinstance(base, ast.Subscript) and isinstance(base.slice, ast.Name):
            return base.slice.id
    return None
