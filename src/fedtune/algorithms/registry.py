"""A validating registry of algorithms by name, importing only the algorithm looked up.

Importing every algorithm costs seconds (FedBiOT, FedMKT and FedPT pull in their model code),
and each KFP task is a fresh process that uses one algorithm, so the built-in names map to the
module that registers them (:data:`BUILTIN`, from each algorithm's declared capabilities,
which need pydantic only) and :func:`get_algorithm` imports that module alone. Listing and
validating names imports no algorithm. A test checks the table against
the ``@register`` decorators in the source and against what importing each module registers.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

from fedtune.config.capabilities import table
from fedtune.core.errors import RegistryError

if TYPE_CHECKING:
    from fedtune.algorithms.base import Algorithm

A = TypeVar("A", bound="type[Algorithm[Any]]")

_ALGORITHMS: dict[str, type[Algorithm[Any]]] = {}

BUILTIN: Final[dict[str, str]] = {name: caps.module for name, caps in table().items()}
"""Every built-in algorithm name and the module whose ``@register`` defines it, from each
algorithm's declared capabilities (:mod:`fedtune.config.capabilities`)."""


def register(*names: str) -> Callable[[A], A]:
    """Class decorator: make an algorithm selectable under ``names`` in the job config."""

    def wrap(cls: A) -> A:
        for name in names:
            if name in _ALGORITHMS and _ALGORITHMS[name] is not cls:
                raise RegistryError(
                    f"algorithm name {name!r} is registered twice "
                    f"({_ALGORITHMS[name].__qualname__} and {cls.__qualname__})",
                    fix="Give the new algorithm a name of its own.",
                )
            _ALGORITHMS[name] = cls
        return cls

    return wrap


def get_algorithm(name: str) -> type[Algorithm[Any]]:
    """The algorithm class registered under ``name`` (importing only its module)."""
    if name not in _ALGORITHMS and name in BUILTIN:
        importlib.import_module(BUILTIN[name])
    try:
        return _ALGORITHMS[name]
    except KeyError:
        raise RegistryError(
            f"unknown algorithm {name!r}; registered: {algorithm_names()}"
        ) from None


def algorithm_names() -> list[str]:
    """Every registered algorithm name, sorted (nothing is imported)."""
    return sorted(set(BUILTIN) | set(_ALGORITHMS))
