"""The tests' job builders return dicts that share nothing with their arguments.

Many test files build jobs from the shared per-algorithm tables (``TABLE``, ``JOB_OVERRIDES``)
and then edit the result. When a builder kept the caller's lists, one file's edit
(a tenant's ``dp_sgd``) reached every later file in the same pytest worker.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import tiny_job_dict
from tests.integration.test_algorithm_table import JOB_OVERRIDES, TABLE
from tests.kfp.conftest import cluster_job_dict, two_tenant_dict


def _scribble(value: Any) -> None:
    """Edit every dict and list reachable from ``value`` in place."""
    if isinstance(value, dict):
        for inner in list(value.values()):
            _scribble(inner)
        value["scribbled"] = True
    elif isinstance(value, list):
        for inner in list(value):
            _scribble(inner)
        value.append("scribbled")


BUILDERS: dict[str, Callable[..., dict[str, Any]]] = {
    "tiny_job_dict": tiny_job_dict,
    "two_tenant_dict": two_tenant_dict,
    "cluster_job_dict": lambda _workdir, **fields: cluster_job_dict(**fields),
}


@pytest.mark.parametrize("builder", sorted(BUILDERS))
def test_editing_a_built_job_leaves_every_algorithms_shared_rows_unchanged(
    tmp_path: Path, builder: str
) -> None:
    before = copy.deepcopy((TABLE, JOB_OVERRIDES))
    for name in sorted(TABLE):
        built = BUILDERS[builder](tmp_path, algorithm=TABLE[name], **JOB_OVERRIDES[name])
        _scribble(built)
    assert (TABLE, JOB_OVERRIDES) == before


def test_the_scribble_reaches_a_shared_row_when_a_builder_keeps_it() -> None:
    """The check above can fail: a builder that keeps its arguments lets the edit through."""
    shared = copy.deepcopy(JOB_OVERRIDES)
    kept = {"algorithm": TABLE["fedmkt"], **shared["fedmkt"]}  # what the old builder returned
    _scribble(kept)
    assert shared != JOB_OVERRIDES
