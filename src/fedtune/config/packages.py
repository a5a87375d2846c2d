"""The algorithm packages, found by looking in ``fedtune.algorithms``, not by a list.

An algorithm is one package ``fedtune/algorithms/<name>/`` whose ``config`` module defines
``ALGORITHM``, an :class:`AlgorithmSpec`: its config section(s), each declaring its tenant part
and capabilities, and the smallest settings that run it. The package's ``algorithm`` module
(torch, transformers, peft) registers the classes and is imported only when a job names one
(:mod:`fedtune.algorithms.registry`). Everything that lists algorithms (the config union, the
support lists, the pipeline families, the CLI, the test tables) reads :func:`specs`, so
deleting a package removes its algorithms everywhere, and adding one is one package.

Reading the specs imports each package's ``config`` module only (pydantic, no torch). The
import is by name, found at run time: the config layer depends on the packages' sections, never
on algorithm code (the import contracts in pyproject.toml see no edge from here).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, get_args

if TYPE_CHECKING:
    from fedtune.config.sections import AlgorithmSection

_ROOT = "fedtune.algorithms"


@dataclass(frozen=True)
class Smoke:
    """The smallest job that runs one round of an algorithm on the tiny test model.

    Attributes:
        algorithm: The ``algorithm:`` section (with ``name``).
        job: Other job fields it needs (e.g. a deeper tiny ``model`` to split).
        public_data: The job needs a public dataset (``public_data_uri``).
        tenant: Fields every tenant entry adds (e.g. its own ``model`` and ``tokenizer``).
        single_tenant: The algorithm runs one tenant that holds all the data.
    """

    algorithm: Mapping[str, Any]
    job: Mapping[str, Any] = field(default_factory=dict)
    public_data: bool = False
    tenant: Mapping[str, Any] = field(default_factory=dict)
    single_tenant: bool = False


@dataclass(frozen=True)
class AlgorithmSpec:
    """What an algorithm package declares about itself.

    Attributes:
        sections: Its config section classes (members of the job's ``algorithm`` union).
        smoke: For every name its sections accept, the smallest job that runs it.
    """

    sections: tuple[type[AlgorithmSection], ...]
    smoke: Mapping[str, Smoke]

    def __post_init__(self) -> None:
        names = [n for s in self.sections for n in get_args(s.model_fields["name"].annotation)]
        if sorted(names) != sorted(self.smoke) or any(
            self.smoke[n].algorithm.get("name") != n for n in names
        ):
            raise TypeError(
                f"an AlgorithmSpec declares the names {sorted(names)} in its sections but smoke "
                f"settings for {sorted(self.smoke)}; give each name one Smoke whose algorithm "
                "section carries that name"
            )

    @property
    def names(self) -> tuple[str, ...]:
        """Every algorithm name the package's sections accept."""
        return tuple(self.smoke)


@functools.cache
def specs() -> dict[str, AlgorithmSpec]:
    """Every algorithm package under ``fedtune.algorithms`` and its spec, by package name.

    Raises:
        TypeError: A package's ``config`` module has no :class:`AlgorithmSpec` ``ALGORITHM``.
    """
    root = importlib.import_module(_ROOT)
    found: dict[str, AlgorithmSpec] = {}
    for info in sorted(pkgutil.iter_modules(root.__path__), key=lambda i: i.name):
        module_name = f"{_ROOT}.{info.name}.config"
        if not info.ispkg or importlib.util.find_spec(module_name) is None:
            continue
        spec = getattr(importlib.import_module(module_name), "ALGORITHM", None)
        if not isinstance(spec, AlgorithmSpec):
            raise TypeError(
                f"{module_name} defines no ALGORITHM = AlgorithmSpec(...); an algorithm package "
                "declares its config sections and smoke settings there"
            )
        found[info.name] = spec
    return found


def sections() -> tuple[type[AlgorithmSection], ...]:
    """Every algorithm's config section, packages in name order."""
    return tuple(s for spec in specs().values() for s in spec.sections)


def smoke(name: str) -> Smoke:
    """The smoke settings of algorithm ``name``.

    Raises:
        KeyError: No package declares that name.
    """
    for spec in specs().values():
        if name in spec.smoke:
            return spec.smoke[name]
    raise KeyError(name)
