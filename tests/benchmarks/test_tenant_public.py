"""FedMKT's public set drawn from the tenants' distribution: new records only, deterministic,
checked, and what the FedMKT comparison's jobs read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fedtune.benchmarks.suite import (
    SCARCE_CATEGORIES,
    SuiteSpec,
    build_suite,
    read_set,
    write_suite,
)
from fedtune.benchmarks.tenant_public import TENANT_PUBLIC_DIR, ensure_tenant_public_set
from fedtune.core.errors import ConfigError, DataError

SPEC = SuiteSpec(private_records=200, public_records=100, pretrain_records=400, self_instruct_records=20)


@pytest.fixture()
def suite_dir(tmp_path: Path) -> Path:
    out = tmp_path / "suite"
    write_suite(build_suite(SPEC), out)
    return out


def _keys(records: list[dict[str, str]]) -> set[str]:
    return {json.dumps(r, sort_keys=True) for r in records}


def test_every_drawn_record_is_new_and_in_the_tenants_categories(suite_dir: Path) -> None:
    path, manifest = ensure_tenant_public_set(suite_dir, 60)
    drawn = read_set(path.parent, "public")
    assert len(drawn) == len(_keys(drawn)) == manifest["public"]["records"] == 60
    suite = set().union(*(
        _keys(read_set(suite_dir, name)) for name in ("central", "public", "test", "validation", "pretrain")
    ))
    # No record any party already holds: not the tenants', the suite's public or test ones,
    # nor one the base models were pretrained on.
    assert not _keys(drawn) & suite
    expected = {c for c, w in SPEC.tenant_mixture.items() if w > 0 and c not in SCARCE_CATEGORIES}
    counts = manifest["public"]["category_counts"]
    assert {c for c, n in counts.items() if n} == expected
    # The tenants' mixture, less the scarce categories: equal shares here.
    assert sorted(counts[c] for c in expected) == [15] * len(expected)


def test_the_set_is_deterministic_reused_redrawn_and_checked(suite_dir: Path, tmp_path: Path) -> None:
    path, manifest = ensure_tenant_public_set(suite_dir, 40)
    assert path == suite_dir / TENANT_PUBLIC_DIR / "public.jsonl"
    other = tmp_path / "again"
    shutil.copytree(suite_dir, other, ignore=shutil.ignore_patterns(TENANT_PUBLIC_DIR))
    assert ensure_tenant_public_set(other, 40)[1]["files"] == manifest["files"]
    before = path.stat().st_mtime_ns
    assert ensure_tenant_public_set(suite_dir, 40)[1] == manifest  # reused, not redrawn
    assert path.stat().st_mtime_ns == before
    assert ensure_tenant_public_set(suite_dir, 20)[1]["public"]["records"] == 20  # redrawn
    path.write_text("{}\n")
    with pytest.raises(DataError) as info:
        ensure_tenant_public_set(suite_dir, 20)
    assert "public.jsonl" in str(info.value) and "Delete" in (info.value.fix or "")


def test_no_records_is_refused_before_anything_is_written(suite_dir: Path) -> None:
    with pytest.raises(ConfigError) as info:
        ensure_tenant_public_set(suite_dir, 0)
    assert "0 records" in str(info.value)
    assert not (suite_dir / TENANT_PUBLIC_DIR).exists()


def test_a_negative_size_in_a_quality_spec_is_refused() -> None:
    from dataclasses import replace

    from fedtune.benchmarks.presets import get_preset
    from fedtune.benchmarks.quality import _check

    with pytest.raises(ConfigError) as info:
        _check(replace(get_preset("ci").fedmkt_quality, tenant_public_records=-1))
    assert "tenant_public_records=-1" in str(info.value)


def test_no_suite_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        ensure_tenant_public_set(tmp_path, 10)


def test_the_fedmkt_comparisons_jobs_read_the_drawn_set_and_others_the_suites(
    ci_workspace: Path, tmp_path: Path
) -> None:
    from fedtune.benchmarks.presets import get_preset
    from fedtune.benchmarks.quality import _Bench
    from fedtune.benchmarks.workspace import Workspace

    root = tmp_path / "ws"
    shutil.copytree(ci_workspace / "suite", root / "suite", ignore=shutil.ignore_patterns(TENANT_PUBLIC_DIR))
    shutil.copytree(ci_workspace / "models", root / "models")
    preset = get_preset("ci")
    for spec, algorithm, expected in (
        (preset.fedmkt_quality, "fedmkt", root / "suite" / TENANT_PUBLIC_DIR / "public.jsonl"),
        (preset.quality, "fedavg", root / "suite" / "public.jsonl"),
    ):
        bench = _Bench(Workspace(root), spec, lambda _line: None)
        job = bench.job(
            name="q", algorithm=algorithm, tenants=bench.tenants, seed=0, workdir=tmp_path / "w",
            local_steps=1,
        )
        assert Path(str(job.public_data_uri)) == expected.resolve()
        assert expected.is_file()
