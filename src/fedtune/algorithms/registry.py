"""A validating registry of algorithms by name, importing only the algorithm looked up.

Importing every algorithm costs seconds (FedBiOT, FedMKT and FedPT pull in their model code),
and each KFP task is a fresh process that uses one algorithm, so the built-in names map to the
module that registers them (:data:`BUILTIN`, from each algorithm's declared capabilities,
which need pydantic only) and :func:`get_algorithm` imports that module alone. Listing and
validating names imports no algorithm. ``@register`` takes no names: a class answers to the
names its config section accepts. A test checks the table against the catalog read from the
source and against what importing each module registers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final, TypeVar, get_args

from fedtune.config.capabilities import table
from fedtune.core.errors import RegistryError

if TYPE_CHECKING:
    from fedtune.algorithms.base import Algorithm

A = TypeVar("A", bound="type[Algorithm[Any]]")

_ALGORITHMS: dict[str, type[Algorithm[Any]]] = {}

BUILTIN: Final[dict[str, str]] = {name: caps.module for name, caps in table().items()}
"""Every built-in algorithm name and the module whose ``@register`` defines it, from each
algorithm's declared capabilities (:mod:`fedtune.config.capabilities`)."""


def section_names(cls: type) -> tuple[str, ...]:
    """The names an algorithm class answers to: the ``Literal`` of the ``name`` field of the
    config section it is parameterised with (``class FedAvg(LoraFedAlgorithm[FedAvgConfig])``).

    Raises:
        RegistryError: No base of ``cls`` is parameterised with a section that has a ``name``.
    """
    for klass in cls.__mro__:
        for base in klass.__dict__.get("__orig_bases__", ()):
            for arg in get_args(base):
                field = getattr(arg, "model_fields", {}).get("name")
                if field is not None:
                    return tuple(get_args(field.annotation))
    raise RegistryError(
        f"algorithm class {cls.__qualname__} names no config section",
        fix="Parameterise it with its package's section, e.g. "
        "`class MyAlgo(LoraFedAlgorithm[MyAlgoConfig])`; the section's `name` Literal is the "
        "name a job selects it by.",
    )


def register(cls: A) -> A:
    """Class decorator: make an algorithm selectable in the job config under the names its
    config section accepts (:func:`section_names`; the names are written once, there)."""
    for name in section_names(cls):
        if name in _ALGORITHMS and _ALGORITHMS[name] is not cls:
            raise RegistryError(
                f"algorithm name {name!r} is registered twice "
                f"({_ALGORITHMS[name].__qualname__} and {cls.__qualname__})",
                fix="Give the new algorithm a name of its own.",
            )
        _ALGORITHMS[name] = cls
    return cls


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
