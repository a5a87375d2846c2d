"""A validating registry of algorithms by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from fedtune.core.errors import RegistryError

if TYPE_CHECKING:
    from fedtune.algorithms.base import Algorithm

A = TypeVar("A", bound="type[Algorithm]")

_ALGORITHMS: dict[str, type[Algorithm]] = {}


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


def get_algorithm(name: str) -> type[Algorithm]:
    """The algorithm class registered under ``name``."""
    import fedtune.algorithms  # noqa: F401  (registers the built-in algorithms)

    try:
        return _ALGORITHMS[name]
    except KeyError:
        raise RegistryError(
            f"unknown algorithm {name!r}; registered: {sorted(_ALGORITHMS)}"
        ) from None


def algorithm_names() -> list[str]:
    """Every registered algorithm name, sorted."""
    import fedtune.algorithms  # noqa: F401

    return sorted(_ALGORITHMS)
