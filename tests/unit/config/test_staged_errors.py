"""Every problem of a job at once: a wrong type never hides an unknown key or a cross-field check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from fedtune.config import parse_job
from fedtune.config.base import StrictModel, scalar_kinds
from fedtune.config.job import JobConfig
from fedtune.core.errors import ConfigError
from tests.unit.config.test_job_config import VALID


def _problems(raw: dict[str, Any], tmp_path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_job(raw, base_dir=tmp_path)
    return [line.strip() for line in str(info.value).splitlines()[1:]]


def _int_only_field(model: type[BaseModel]) -> str | None:
    """A field of ``model`` that takes integers and no strings or floats (a quoted one is refused)."""
    for name, field in model.model_fields.items():
        kinds = scalar_kinds(field.annotation)
        if "int" in kinds and not kinds & {"str", "float", "other"}:
            return field.alias or name
    return None


def _sections() -> list[tuple[str, type[StrictModel], str]]:
    """Every job section (a StrictModel field of JobConfig) that has an integer-only field."""
    found = []
    for name, field in JobConfig.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, StrictModel):
            if (int_field := _int_only_field(annotation)) is not None:
                found.append((name, annotation, int_field))
    return found


def test_sections_found() -> None:
    assert {"training", "lora", "engine"} <= {name for name, _, _ in _sections()}


@pytest.mark.parametrize(("section", "model", "int_field"), _sections(), ids=lambda v: str(v))
def test_quoted_integer_and_unknown_key_in_one_section_both_reported(
    section: str, model: type[StrictModel], int_field: str, tmp_path: Path
) -> None:
    raw = {**VALID, section: {int_field: "3", "no_such_key": 1}}
    problems = _problems(raw, tmp_path)
    assert any(p.startswith(f"{section}.{int_field}: expected an integer") for p in problems), problems
    assert any(p.startswith(f"{section}.no_such_key: Extra inputs") for p in problems), problems


def test_type_unknown_key_and_cross_field_check_in_one_report(tmp_path: Path) -> None:
    """The issue's case: three problems of three stages, one run of `validate`."""
    raw = {
        **VALID,
        "model": {"source": "pretrained", "uri": "base"},  # fedavg needs model.tenant_uri
        "rounds": "3",
        "trainig": {"lr": 0.1},
    }
    problems = _problems(raw, tmp_path)
    assert len(problems) == 3, problems
    assert problems[0].startswith("rounds: expected an integer, got the string '3'")
    assert problems[1].startswith("trainig: Extra inputs are not permitted")
    assert "model.tenant_uri is not set" in problems[2]


def test_section_check_on_a_dropped_field_is_not_reported(tmp_path: Path) -> None:
    """A section's own check never judges the default that replaced a refused value."""
    raw = {**VALID, "training": {"local_steps": "10"}}  # dropped: local_steps falls back
    problems = _problems(raw, tmp_path)
    assert problems == [
        "training.local_steps: expected an integer, got the string '10'; write it without quotes"
    ]


def test_a_valid_job_is_unchanged_by_staging(tmp_path: Path) -> None:
    assert parse_job(VALID, base_dir=tmp_path).rounds == JobConfig.model_fields["rounds"].default
