"""Every runtime context in src/ is typed as the side it belongs to, never ``Any``.

mypy can only check the provider/tenant split where a context's type is written down: a
``ctx: Any`` parameter lets either side's context, or anything else, through unchecked.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "src" / "fedtune"
CONTEXT_TYPES = {"ProviderContext", "TenantContext", "ProviderContext | TenantContext"}


def test_every_ctx_parameter_names_a_context_type() -> None:
    untyped = []
    seen = 0
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            for argument in arguments:
                if argument.arg != "ctx":
                    continue
                seen += 1
                annotation = ast.unparse(argument.annotation) if argument.annotation else None
                if annotation not in CONTEXT_TYPES:
                    where = f"{path.relative_to(SRC)}:{node.lineno} {node.name}"
                    untyped.append(f"{where}(ctx: {annotation})")
    assert seen > 50  # the scan found the algorithms' phases
    assert untyped == []
