"""The job's ``algorithm`` section: a discriminated union on ``name`` of every algorithm
package's config section, and the lists derived from their capabilities.

Each section lives in its algorithm's package (``fedtune/algorithms/<name>/config.py``, found
by :mod:`fedtune.config.packages`); nothing here names an algorithm. The shared bases are
in :mod:`fedtune.config.sections`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import Field

from fedtune.config.capabilities import capabilities_of, names_where
from fedtune.config.packages import sections
from fedtune.config.sections import AlgorithmSection

if TYPE_CHECKING:
    # Each algorithm narrows its own section (``LoraFedAlgorithm[FedProxConfig]``); the union
    # is only known once the packages are found, so checkers see any section.
    AlgorithmConfig = Any
else:
    AlgorithmConfig = Annotated[
        Union[sections()],  # noqa: UP007 - built at run time from the packages
        Field(discriminator="name"),
    ]


def tenants_load_base(name: str) -> bool:
    """Whether the tenants of algorithm ``name`` build the base model themselves.

    Raises:
        KeyError: No config section has that algorithm name.
    """
    return capabilities_of(name).tenants_load_base


def summed_update_algorithms() -> list[str]:
    """Algorithm names whose aggregation needs only the sum of the updates (secure aggregation)."""
    return sorted(names_where("summed_update"))


def algorithm_sections() -> tuple[type[AlgorithmSection], ...]:
    """Every algorithm's config section (the members of :data:`AlgorithmConfig`)."""
    return sections()


#: The tenant part of any algorithm's section, told apart by ``name`` (what a tenant's view
#: carries; see :mod:`fedtune.config.tenant_view`).
AlgorithmTenantPart: Any = Annotated[
    Union[tuple(s.TenantPart for s in algorithm_sections())],  # noqa: UP007 - built at run time
    Field(discriminator="name"),
]
