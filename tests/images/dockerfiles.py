"""Reading Dockerfiles for the image tests: logical lines, pip installs, named modules."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

# pip options that take a value (the value is not a requirement).
PIP_VALUE_OPTIONS = {
    "-c",
    "--constraint",
    "-r",
    "--requirement",
    "-i",
    "--index-url",
    "--extra-index-url",
    "-f",
    "--find-links",
    "-t",
    "--target",
    "--prefix",
    "--root",
    "--platform",
    "--python-version",
    "--implementation",
    "--abi",
    "--cache-dir",
    "--src",
    "-e",
    "--editable",
}
# `python -m pkg.mod` in shell form, and "python", "-m", "pkg.mod" in exec (JSON) form.
PYTHON_M_SHELL = re.compile(r"\bpython3?(?:\.\d+)?\s+-m\s+([A-Za-z_][\w.]*)")
PYTHON_M_EXEC = re.compile(
    r"""["']python3?(?:\.\d+)?["']\s*,\s*["']-m["']\s*,\s*["']([A-Za-z_][\w.]*)["']"""
)


@dataclass(frozen=True)
class PipInstall:
    """One ``pip install`` command of a RUN instruction."""

    requirements: tuple[str, ...]  # requirement strings, as written
    paths: tuple[str, ...]  # local projects installed from a path
    options: tuple[tuple[str, str | None], ...]  # (option, value)

    def option(self, name: str) -> str | None:
        """The value of ``name`` (None if absent or valueless)."""
        return next((v for k, v in self.options if k == name), None)


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    logical: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # comment lines inside a continued instruction
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    if current:
        logical.append(current)
    out = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        out.append((keyword.upper(), args.strip()))
    return out


def _commands(args: str) -> list[list[str]]:
    """Shell words of a RUN's commands, split at ``&&``, ``||``, ``;``, ``|`` outside quotes."""
    lexer = shlex.shlex(args, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in {"&&", "||", ";", "|", "&"}:
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def pip_installs(text: str) -> list[PipInstall]:
    """Every ``pip install`` of the RUN instructions of a Dockerfile."""
    found = []
    for keyword, args in instructions(text):
        if keyword != "RUN":
            continue
        for tokens in _commands(args):
            if "pip" not in tokens or "install" not in tokens:
                continue
            rest = tokens[tokens.index("install") + 1 :]
            reqs, paths, options = [], [], []
            i = 0
            while i < len(rest):
                tok = rest[i]
                if tok.startswith("-"):
                    name, eq, value = tok.partition("=")
                    if name in PIP_VALUE_OPTIONS and not eq:
                        options.append((name, rest[i + 1]))
                        i += 2
                        continue
                    options.append((name, value if eq else None))
                elif tok.startswith(("/", ".", "$")):
                    paths.append(tok)
                else:
                    reqs.append(tok)
                i += 1
            found.append(PipInstall(tuple(reqs), tuple(paths), tuple(options)))
    return found


def python_modules(text: str) -> set[str]:
    """Modules run as ``python -m MODULE`` (shell or exec form) anywhere in ``text``."""
    return set(PYTHON_M_SHELL.findall(text)) | set(PYTHON_M_EXEC.findall(text))


def env_value(text: str, name: str) -> str | None:
    """The last value an ``ENV`` instruction gives ``name``."""
    value = None
    for keyword, args in instructions(text):
        if keyword == "ENV":
            for token in shlex.split(args):
                key, eq, val = token.partition("=")
                if eq and key == name:
                    value = val
    return value


def base_images(text: str) -> list[str]:
    """Image references of FROM lines, with ARG defaults substituted."""
    defaults: dict[str, str] = {}
    images = []
    for keyword, args in instructions(text):
        if keyword == "ARG" and "=" in args:
            key, _, value = args.partition("=")
            defaults[key.strip()] = value.strip().strip('"')
        elif keyword == "FROM":
            ref = args.split()[0]
            ref = re.sub(r"\$\{(\w+)\}", lambda m: defaults.get(m.group(1), m.group(0)), ref)
            images.append(ref)
    return images


def read(path: Path) -> str:
    """A file's text."""
    return path.read_text(encoding="utf-8")
