"""The registered algorithms read from their source, without importing them.

Importing an algorithm imports torch, transformers and peft (seconds); ``fedtune
algorithms`` only needs each name and the first line of its class docstring, which the
``@register(...)`` decorators and docstrings in ``fedtune/algorithms`` state plainly. A test
checks this catalog against the registry that the imports fill.
"""

from __future__ import annotations

import ast
from importlib import resources


def algorithm_catalog() -> dict[str, str]:
    """Every registered algorithm name and the first line of its class docstring, sorted."""
    found: dict[str, str] = {}
    root = resources.files("fedtune") / "algorithms"
    with resources.as_file(root) as folder:
        for path in sorted(folder.rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    first = ((ast.get_docstring(node) or "").strip().splitlines() or [""])[0]
                    for name in _registered_names(node):
                        found[name] = first
    return dict(sorted(found.items()))


def _registered_names(node: ast.ClassDef) -> list[str]:
    names: list[str] = []
    for decorator in node.decorator_list:
        if not isinstance(decorator, ast.Call):
            continue
        func = decorator.func
        called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if called == "register":
            names += [
                a.value for a in decorator.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
            ]
    return names
