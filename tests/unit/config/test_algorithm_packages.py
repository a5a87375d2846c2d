"""An algorithm is one package: deleting it removes it everywhere, with no other edit.

The source tree is copied, one algorithm package deleted, and a fresh interpreter on the copy
asked what the job config, the CLI, the support lists, the pipeline families and the test
tables know: the deleted algorithm is refused as unknown (the error lists what is installed),
and every other algorithm's smoke job still validates.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import ClassVar, Generic, Literal, TypeVar

import pytest
import yaml

from fedtune.algorithms import registry
from fedtune.algorithms.registry import algorithm_names
from fedtune.config.capabilities import Capabilities, families
from fedtune.config.packages import AlgorithmSpec, Smoke, specs
from fedtune.config.sections import WeightedMeanConfig
from fedtune.core.errors import ConfigError, RegistryError
from fedtune.pipelines.catalog import pipeline_name_of, repo_root
from tests.helpers.algorithms import SMOKE
from tests.integration.conftest import tiny_job_dict

C = TypeVar("C")

_PROBE = r"""
import contextlib, io, json, pathlib, sys
import yaml
from fedtune.algorithms import registry
from fedtune.algorithms.registry import algorithm_names
from fedtune.cli.main import main
from fedtune.config import parse_job
from fedtune.config.algorithms import summed_update_algorithms
from fedtune.config.capabilities import dp_sgd_algorithms, names_where
from fedtune.core.errors import ConfigError, RegistryError
from fedtune.pipelines.job_files import job_files
from fedtune.pipelines.run_form import FAMILIES
from tests.helpers.algorithms import SMOKE, job_overrides

base, gone, path, repo = json.loads(sys.argv[1])
out = {"names": algorithm_names(), "smoke": sorted(SMOKE), "families": FAMILIES,
       "secure": summed_update_algorithms(), "dp_sgd": dp_sgd_algorithms(),
       "central_dp": names_where("central_dp"), "invalid": {}}
for name, row in SMOKE.items():
    try:
        parse_job({**base, "algorithm": row, **job_overrides(name)})
    except ConfigError as exc:
        out["invalid"][name] = exc.render()
try:
    parse_job({**base, "algorithm": {"name": gone}})
    out["refused"] = None
except ConfigError as exc:
    out["refused"] = exc.render()
with open(path, "w") as f:
    yaml.safe_dump({**base, "algorithm": {"name": gone}}, f)
err, listing = io.StringIO(), io.StringIO()
with contextlib.redirect_stderr(err):
    out["validate_rc"] = main(["validate", path])
with contextlib.redirect_stdout(listing):
    main(["algorithms"])
out["validate_err"], out["listing"] = err.getvalue(), listing.getvalue()
out["pipeline_jobs"] = [p.name for p in job_files(pathlib.Path(repo))[0]]
from fedtune.pipelines import catalog
check = io.StringIO()
if catalog.orphans(pathlib.Path(repo)):  # else the check compiles every pipeline (seconds)
    with contextlib.redirect_stdout(check):
        out["check_rc"] = catalog.main(["--check", "--root", repo])
out["check"] = check.getvalue()
print("PROBE " + json.dumps(out))
"""


def _probe(src: Path, gone: str, tmp_path: Path) -> dict[str, object]:
    """What a fresh interpreter on source tree ``src`` knows about the algorithms."""
    base = tiny_job_dict(tmp_path / "w")
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps([base, gone, str(tmp_path / "job.yaml"), str(repo_root())])],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{src}:{repo_root()}", "COLUMNS": "400",
             "OMP_NUM_THREADS": "1"},
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    lines = [x for x in done.stdout.splitlines() if x.startswith("PROBE ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return dict(json.loads(lines[-1].removeprefix("PROBE ")))


#: FedProx shares the FedIT family's pipeline; FewFedPIT has a family (and pipeline) of its own.
@pytest.mark.parametrize("package", ["fedprox", "fewfedpit"])
def test_deleting_an_algorithm_package_removes_it_everywhere(package: str, tmp_path: Path) -> None:
    names = set(specs()[package].names)
    # Present in every list before the deletion (the probe below can fail).
    assert names <= set(algorithm_names()) and names <= set(SMOKE)
    assert any(names & set(members) for members in families().values())
    src = tmp_path / "src"
    shutil.copytree(repo_root() / "src" / "fedtune", src / "fedtune",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.rmtree(src / "fedtune" / "algorithms" / package)
    gone = sorted(names)[0]

    seen = _probe(src, gone, tmp_path)

    left = sorted(set(algorithm_names()) - names)
    assert seen["names"] == left and seen["smoke"] == left
    assert seen["invalid"] == {}  # every other algorithm's smoke job still validates
    # The catalog compiles the pipeline job files of the algorithms still installed.
    jobs = sorted((repo_root() / "pipelines" / "jobs").glob("*.yaml"))
    kept = [p.name for p in jobs if yaml.safe_load(p.read_text())["algorithm"]["name"] not in names]
    assert seen["pipeline_jobs"] == kept
    # The job file left behind, and all that was compiled from it, fail the catalog check by name.
    left_behind = [p for p in jobs if p.name not in kept]
    check = str(seen["check"])
    assert seen.get("check_rc") == (1 if left_behind else None)
    assert check.count("orphan: ") == 5 * len(left_behind)  # job, 2 compiled, 2 chart files
    for job_file in left_behind:
        assert f"orphan: pipelines/jobs/{job_file.name}: algorithm {gone!r} has no package" in check
        for stem in (job_file.stem, f"{job_file.stem}-gpu"):
            compiled = repo_root() / "pipelines" / "compiled" / f"{stem}.yaml"
            chart = f"charts/fedtune/files/pipelines/{pipeline_name_of(compiled.read_text())}.yaml"
            for generated in (f"pipelines/compiled/{stem}.yaml", chart):
                assert f"orphan: {generated}: compiled from pipelines/jobs/{job_file.name}" in check
    for listed in ("secure", "dp_sgd", "central_dp"):
        assert not names & set(seen[listed]), listed  # type: ignore[arg-type]
    family_members = [n for members in seen["families"].values() for n in members]  # type: ignore[union-attr]
    assert sorted(family_members) == left
    for text in (seen["refused"], seen["validate_err"]):
        assert isinstance(text, str) and f"unknown algorithm {gone!r}" in text
        assert all(repr(name) in text for name in left)  # the error lists what is installed
    assert seen["validate_rc"] == ConfigError.exit_code
    listed_names = {line.split()[0] for line in str(seen["listing"]).splitlines() if line.strip()}
    assert listed_names == set(left)


def test_a_spec_must_give_every_name_its_smoke_settings() -> None:
    class TwoNames(WeightedMeanConfig):
        capabilities: ClassVar[Capabilities] = Capabilities(module="nowhere", family="fedit")
        name: Literal["one", "two"]

    with pytest.raises(TypeError, match=r"smoke settings for \['one'\]"):
        AlgorithmSpec(sections=(TwoNames,), smoke={"one": Smoke({"name": "one"})})
    with pytest.raises(TypeError, match="carries that name"):
        AlgorithmSpec(sections=(TwoNames,), smoke={n: Smoke({"name": "one"}) for n in ("one", "two")})


def test_a_registered_class_answers_to_its_sections_names(monkeypatch: pytest.MonkeyPatch) -> None:
    class Section(WeightedMeanConfig):
        capabilities: ClassVar[Capabilities] = Capabilities(module="nowhere", family="fedit")
        name: Literal["probe-one", "probe-two"]

    class Base(Generic[C]):
        pass

    class Named(Base[Section]):
        """Registered under its section's names, written only there."""

    class Unnamed(Base[int]):
        """Parameterised with no config section."""

    monkeypatch.setattr(registry, "_ALGORITHMS", {})
    registry.register(Named)  # type: ignore[type-var]
    assert {n: registry.get_algorithm(n) for n in ("probe-one", "probe-two")} == {
        "probe-one": Named, "probe-two": Named,
    }
    with pytest.raises(RegistryError, match="Unnamed names no config section") as caught:
        registry.register(Unnamed)  # type: ignore[type-var]
    assert "LoraFedAlgorithm[MyAlgoConfig]" in caught.value.render()
