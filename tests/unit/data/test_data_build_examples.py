"""The shipped quickstart data is exactly what the build script generates, and fit for use."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

from fedtune.data.build_examples import TENANTS, main, render_files
from fedtune.data.formats import load_examples
from fedtune.data.jsonl import read_jsonl

SHIPPED = Path(__file__).resolve().parents[3] / "examples" / "data" / "quickstart"


def test_shipped_files_equal_the_generated_ones() -> None:
    files = render_files()
    assert sorted(p.name for p in SHIPPED.iterdir()) == sorted(files)
    for name, data in files.items():
        assert (SHIPPED / name).read_bytes() == data, (
            f"{name} is stale: run python -m fedtune.data.build_examples"
        )
    assert sum(len(d) for d in files.values()) < 200_000


def _categories(name: str) -> Counter[str]:
    return Counter(r["category"] for r in read_jsonl(SHIPPED / name))


def test_tenants_split_all_and_are_dominated_by_different_categories() -> None:
    everything = read_jsonl(SHIPPED / "all.jsonl")
    assert len(everything) == 300 and len(_categories("all.jsonl")) == 5
    tenant_records = [r for t in TENANTS for r in read_jsonl(SHIPPED / f"{t}.jsonl")]
    assert sorted(map(str, tenant_records)) == sorted(map(str, everything))
    dominant = [_categories(f"{t}.jsonl").most_common(1)[0][0] for t in TENANTS]
    assert len(set(dominant)) == len(TENANTS)
    for tenant in TENANTS:
        assert len(_categories(f"{tenant}.jsonl")) < 5  # non-IID: not every category


def test_public_and_test_sets_differ_and_do_not_overlap() -> None:
    public = _categories("public.jsonl")
    assert sum(public.values()) == 100
    assert public.most_common(1)[0][0] == "arithmetic" and public["reverse"] == 10
    assert set(_categories("test.jsonl").values()) == {20}
    pairs = {
        name: {(r["instruction"], r["context"]) for r in read_jsonl(SHIPPED / name)}
        for name in ("all.jsonl", "public.jsonl", "test.jsonl")
    }
    assert not pairs["all.jsonl"] & pairs["public.jsonl"]
    assert not pairs["test.jsonl"] & (pairs["all.jsonl"] | pairs["public.jsonl"])
    for name in pairs:
        assert load_examples(SHIPPED / name)  # every file reads as a dataset


def test_main_writes_and_checks(tmp_path: Path) -> None:
    out = tmp_path / "quickstart"
    assert main(["--out", str(out), "--check"]) == 1  # nothing there yet
    assert main(["--out", str(out)]) == 0
    assert main(["--out", str(out), "--check"]) == 0
    shutil.copy(out / "public.jsonl", out / "tenant-a.jsonl")
    assert main(["--out", str(out), "--check"]) == 1
