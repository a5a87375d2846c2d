"""A rendered container's command and environment, made runnable as a local process.

What kubelet would do for the env: literal values as they are, ``secretKeyRef`` resolved from
a table of test Secrets; container paths mapped into local folders, in one pass, longest path
first (a local path that itself starts with a container path is not rewritten twice).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

Secrets = dict[tuple[str, str], str]


def path_mapper(paths: dict[str, Path]) -> Any:
    """A function replacing every container path of ``paths`` in a string by its local one."""
    pattern = re.compile("|".join(re.escape(p) for p in sorted(paths, key=len, reverse=True)))
    return lambda text: pattern.sub(lambda m: str(paths[m.group(0)]), text)


def local_process(
    container: dict[str, Any],
    secrets: Secrets,
    paths: dict[str, Path],
    entrypoint: list[str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """``(argv, env)`` of ``container`` on this machine.

    ``entrypoint`` stands in for the image's when the container sets no ``command``;
    ``python`` becomes this interpreter. A missing Secret key raises ``KeyError`` naming it,
    as kubelet would refuse to start the container.
    """
    local = path_mapper(paths)
    command = container.get("command", entrypoint or [])
    argv = [local(a) for a in command + container.get("args", [])]
    argv = [sys.executable if a == "python" else a for a in argv]
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = local(str(item["value"]))
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = secrets[(ref["name"], ref["key"])]
    return argv, env
