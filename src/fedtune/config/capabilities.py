"""What each algorithm can do, declared once, and every list of algorithms derived from it.

Each algorithm's config section (``fedtune/algorithms/<name>/config.py``) carries one frozen
:class:`Capabilities` as its ``capabilities`` class variable. The secure-aggregation, central
DP and DP-SGD support lists, the pipeline family of each name, the job checks and the engines'
choices all read it, so an algorithm is described in one place. Reading it imports pydantic
only (no torch, no algorithm module), like listing names in the registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, get_args

if TYPE_CHECKING:
    from fedtune.config.base import StrictModel


@dataclass(frozen=True)
class Capabilities:
    """One algorithm's capabilities.

    Attributes:
        module: The module whose ``@register`` defines the algorithm (the registry imports
            it, and only it, when the algorithm is looked up).
        family: The compiled pipeline family that runs it (``pipelines/compiled/<family>``).
        tenants_load_base: Tenants build the base model (a tiny config or
            ``model.tenant_uri``); False: every weight comes in the broadcast package.
        summed_update: Aggregation needs only the weighted sum of the updates, so secure
            aggregation can run it.
        central_dp: The update is a mean of adapter tensors the provider folds in one call,
            so clipping each tenant's adapter delta bounds its influence (``differential_privacy``).
        dp_sgd_refused: Why a tenant's example-level DP-SGD cannot carry its guarantee here;
            None: the client step trains in one ``train_local`` call and releases nothing
            else computed from the data but scalars.
        tenant_models: Every tenant entry names its own model (``tenants[].model``).
        tenants_read_public: The public set is shared with tenants.
        tenant_keeps_model: Each tenant keeps a model of its own in its client state; the
            final evaluate step also scores and exports it, in the tenant's process.
        splittable_client_step: The client step may be cut at a local step boundary and
            continued in another worker process.
        audit: A tenant can run the model its final broadcast carries, or the model it keeps
            (``tenant_keeps_model``), so the memorization audit (``audit.enabled``) applies.
    """

    module: str
    family: str
    tenants_load_base: bool = True
    summed_update: bool = True
    central_dp: bool = False
    dp_sgd_refused: str | None = None
    tenant_models: bool = False
    tenants_read_public: bool = False
    tenant_keeps_model: bool = False
    splittable_client_step: bool = False
    audit: bool = True


def sections() -> list[type[StrictModel]]:
    """Every algorithm config section, in the order of the config union."""
    from fedtune.config.packages import sections as found

    return list(found())


def section_names(section: type[StrictModel]) -> tuple[str, ...]:
    """The algorithm names a config section accepts (its ``name`` literal)."""
    return tuple(get_args(section.model_fields["name"].annotation))


def table() -> dict[str, Capabilities]:
    """Every algorithm name and its capabilities, in the order of the config union."""
    return {
        name: section.capabilities  # type: ignore[attr-defined]
        for section in sections()
        for name in section_names(section)
    }


def capabilities_of(name: str) -> Capabilities:
    """The capabilities of algorithm ``name``.

    Raises:
        KeyError: No config section has that algorithm name.
    """
    return table()[name]


def names_where(flag: str) -> list[str]:
    """The algorithm names whose capability ``flag`` is true, in the order of the union."""
    return [name for name, caps in table().items() if getattr(caps, flag)]


def dp_sgd_algorithms() -> list[str]:
    """The algorithms a tenant's DP-SGD can run under (no refusal declared)."""
    return [name for name, caps in table().items() if caps.dp_sgd_refused is None]


def families() -> dict[str, tuple[str, ...]]:
    """Which algorithms each family's compiled pipeline runs."""
    out: dict[str, list[str]] = {}
    for name, caps in table().items():
        out.setdefault(caps.family, []).append(name)
    return {family: tuple(names) for family, names in out.items()}
