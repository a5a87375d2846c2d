"""Every component folder: its metadata and README agree with its compiled spec."""

from __future__ import annotations

import pytest

from fedtune.pipelines.components import COMPONENTS
from tests.kfp.component_checks import COMPONENTS_DIR, assert_folder_consistent


def test_there_is_one_folder_per_component_and_nothing_else() -> None:
    folders = {
        p.name for p in COMPONENTS_DIR.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))
    }
    assert folders == set(COMPONENTS)
    for name in folders:
        files = {p.name for p in (COMPONENTS_DIR / name).iterdir() if p.is_file()}
        assert {"component.yaml", "metadata.yaml", "README.md", "test_component.py"} <= files, name


@pytest.mark.parametrize("name", sorted(COMPONENTS))
def test_metadata_and_readme_match_the_compiled_spec(name: str) -> None:
    assert_folder_consistent(name)
