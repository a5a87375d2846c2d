"""The Dockerfiles cannot be built here (no container engine), so what they promise is checked
by reading them: every module they or the chart run exists, every version they pin matches
pyproject.toml, nothing is installed unpinned, and they run as the chart's non-root user."""

from __future__ import annotations

import ast
import importlib.metadata as md
import importlib.util
import re
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.images.dockerfiles import (
    base_images,
    env_value,
    instructions,
    pip_installs,
    python_modules,
    read,
)

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "images"
DOCKERFILES = sorted(IMAGES.glob("*/Dockerfile"))
CHART = REPO / "charts" / "fedtune"
CHART_TEXTS = sorted(
    [
        *CHART.glob("templates/**/*.yaml"),
        *CHART.glob("templates/**/*.tpl"),
        *CHART.glob("files/**/*.py"),
    ]
)
LOCK = IMAGES / "requirements.lock"
RUNTIME_UID = 10001
EXTRAS_IN_IMAGES = ("deepspeed",)


def ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(REPO)) for p in paths]


def pyproject_requirements() -> dict[str, Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        lines += extra
    reqs: dict[str, Requirement] = {}
    for line in lines:
        req = Requirement(line)
        reqs.setdefault(canonicalize_name(req.name), req)
    return reqs


def lock_pins() -> dict[str, Version]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep, f"unpinned lock line {line!r}"
            pins[canonicalize_name(name)] = Version(version)
    return pins


def exact_pin(text: str) -> tuple[str, Version]:
    """(normalized name, version) of an ``==`` requirement; fails for anything looser."""
    req = Requirement(text)
    specs = list(req.specifier)
    assert len(specs) == 1 and specs[0].operator == "==" and "*" not in specs[0].version, (
        f"{text!r} is not pinned to one exact version"
    )
    return canonicalize_name(req.name), Version(specs[0].version)


# -- the parser the checks below rely on --------------------------------------------------------


def test_dockerfile_parser_reads_continued_runs_and_exec_forms() -> None:
    text = (
        "FROM ${BASE}\nARG BASE=python:3.11-slim\n"
        "# comment\nRUN pip install -c /x.lock \\\n"
        "    # inner comment\n"
        '    /src "a[b]==1.0" --index-url https://i c==2 && python -m pkg.one --help\n'
        'CMD ["python", "-m", "pkg.two"]\nENV HOME=/tmp A=b\n'
    )
    (pip,) = pip_installs(text)
    assert pip.requirements == ("a[b]==1.0", "c==2")
    assert pip.paths == ("/src",)
    assert pip.option("-c") == "/x.lock" and pip.option("--index-url") == "https://i"
    assert python_modules(text) == {"pkg.one", "pkg.two"}
    assert env_value(text, "HOME") == "/tmp"
    assert [k for k, _ in instructions(text)] == ["FROM", "ARG", "RUN", "CMD", "ENV"]


def test_exact_pin_refuses_ranges() -> None:
    assert exact_pin("torch==2.13.0") == ("torch", Version("2.13.0"))
    for loose in ("torch", "torch>=2.4", "torch==2.*", "torch>=2,<3"):
        with pytest.raises(AssertionError, match="not pinned"):
            exact_pin(loose)


# -- named modules exist ------------------------------------------------------------------------


def named_modules() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in [*DOCKERFILES, *CHART_TEXTS]:
        for module in python_modules(read(path)):
            found.setdefault(module, set()).add(str(path.relative_to(REPO)))
    return found


def test_images_name_the_pipeline_entrypoints() -> None:
    expected = {
        f"fedtune.entrypoints.{step}"
        for step in (
            "server_init",
            "configure_round",
            "client_step",
            "aggregate",
            "close_rounds",
            "final_broadcast",
            "evaluate",
            "export_and_register",
            "secagg_advertise",
            "secagg_share",
            "secagg_unmask",
        )
    }
    for dockerfile in DOCKERFILES:
        assert expected <= python_modules(read(dockerfile)), dockerfile


@pytest.mark.parametrize("module", sorted(named_modules()))
def test_every_module_an_image_or_the_chart_runs_exists(module: str) -> None:
    where = sorted(named_modules()[module])
    assert importlib.util.find_spec(module) is not None, f"{module} (named in {where}) is missing"


def test_the_gpu_image_starts_every_step_the_tenant_launcher_runs() -> None:
    from fedtune.engines.launcher_manifest import STEP_MODULES

    gpu = python_modules(read(IMAGES / "gpu" / "Dockerfile"))
    assert set(STEP_MODULES.values()) <= gpu


def test_chart_scripts_import_only_what_the_cpu_image_installs() -> None:
    """The chart's Jobs run files/scripts/*.py with the CPU image's python."""
    installed = set(lock_pins()) | {
        name
        for pip in pip_installs(read(IMAGES / "cpu" / "Dockerfile"))
        for name in (canonicalize_name(Requirement(r).name) for r in pip.requirements)
    }
    if "COPY src /opt/fedtune/src/src" in read(IMAGES / "cpu" / "Dockerfile"):
        installed.add("fedtune")  # the image installs the project itself from its source
    dists = md.packages_distributions()
    missing = []
    for script in sorted(CHART.glob("files/scripts/*.py")):
        for node in ast.walk(ast.parse(script.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "__future__":
                    continue
                owners = {canonicalize_name(d) for d in dists.get(top, [])}
                if not owners & installed:
                    missing.append(f"{script.name}: {name}")
    assert not missing


def test_the_cpu_image_has_the_driver_sqlalchemy_loads_for_a_postgresql_uri() -> None:
    """The chart's PostgreSQL backend hands `mlflow server` a plain ``postgresql://`` URI; the
    SQLAlchemy the image pins picks the driver module, which the image must install (with
    SQLAlchemy 2.1 that is psycopg 3, not psycopg2: the server would die at start)."""
    import sqlalchemy
    from sqlalchemy.engine import make_url

    assert Version(sqlalchemy.__version__) == lock_pins()["sqlalchemy"]
    module = make_url("postgresql://u:p@db:5432/mlflow").get_dialect().driver
    owners = {canonicalize_name(d) for d in md.packages_distributions().get(module, [])}
    installed = {
        canonicalize_name(Requirement(r).name)
        for pip in pip_installs(read(IMAGES / "cpu" / "Dockerfile"))
        for r in pip.requirements
    } | set(lock_pins())
    assert owners & installed, f"SQLAlchemy loads {module!r} (from {owners}); the image has none"


def test_chart_commands_exist_in_the_cpu_image() -> None:
    """`command: ["mlflow"]` needs the console script from a package the CPU image pins."""
    commands = set()
    for path in CHART.glob("templates/*.yaml"):
        commands |= set(re.findall(r'command:\s*\["([\w-]+)"\]', read(path)))
    assert "mlflow" in commands
    scripts = {ep.name: ep.dist for ep in md.entry_points(group="console_scripts")}
    for command in commands - {"python"}:
        assert command in scripts, command
        dist = scripts[command]
        assert dist is not None and canonicalize_name(dist.name) in lock_pins(), command


# -- pinned versions agree with pyproject ----------------------------------------------------


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=ids(DOCKERFILES))
def test_every_pip_install_is_pinned_and_matches_pyproject(dockerfile: Path) -> None:
    text = read(dockerfile)
    declared = pyproject_requirements()
    installs = pip_installs(text)
    assert installs, "no pip install found"
    for pip in installs:
        for requirement in pip.requirements:
            name, version = exact_pin(requirement)
            if name in declared:
                assert declared[name].specifier.contains(version, prereleases=True), (
                    f"{requirement} does not satisfy pyproject's {declared[name]}"
                )
            if name in lock_pins():
                assert lock_pins()[name] == version, f"{requirement} differs from the lock"
        if pip.paths:
            # The project itself: only with the lock as constraints, copied into the image.
            constraint = pip.option("-c")
            assert constraint is not None, f"{pip.paths} installed without the lock"
            copies = [a for k, a in instructions(text) if k == "COPY"]
            assert any(
                a.split()[0] == "images/requirements.lock" and a.split()[-1] == constraint
                for a in copies
            ), f"{constraint} is not copied from images/requirements.lock"


def test_lock_pins_every_runtime_requirement_within_pyproject() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in EXTRAS_IN_IMAGES:
        lines += project["optional-dependencies"][extra]
    pins = lock_pins()
    for line in lines:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not in {LOCK.name}: run images/lock.py"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"{LOCK.name} pins {name}=={pins[name]}, outside pyproject's {line!r}: "
            "run images/lock.py"
        )


def test_torch_comes_from_an_explicit_pytorch_index() -> None:
    for dockerfile in DOCKERFILES:
        torch = [
            p
            for p in pip_installs(read(dockerfile))
            if any(Requirement(r).name == "torch" for r in p.requirements)
        ]
        assert len(torch) == 1, dockerfile
        assert torch[0].option("--index-url"), f"{dockerfile}: torch without --index-url"
    cpu = next(
        p for p in pip_installs(read(IMAGES / "cpu" / "Dockerfile")) if p.option("--index-url")
    )
    assert cpu.option("--index-url") == "https://download.pytorch.org/whl/cpu"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=ids(DOCKERFILES))
def test_base_images_are_pinned(dockerfile: Path) -> None:
    for image in base_images(read(dockerfile)):
        assert "$" not in image, f"unresolved {image}"
        tag = image.rsplit(":", 1)[-1] if ":" in image.split("/")[-1] else ""
        assert tag and tag != "latest" and re.search(r"\d", tag), f"{image} has no pinned tag"


# -- runtime user and writable paths ---------------------------------------------------------


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=ids(DOCKERFILES))
def test_images_run_as_the_charts_non_root_user_with_home_in_tmp(dockerfile: Path) -> None:
    text = read(dockerfile)
    users = [args for keyword, args in instructions(text) if keyword == "USER"]
    assert users, "no USER instruction: the image would run as root"
    assert users[-1].split(":")[0] == str(RUNTIME_UID)
    assert env_value(text, "HOME") == "/tmp"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["security"]["runAsUser"] == RUNTIME_UID
    from fedtune.engines.launcher_manifest import RUN_AS

    assert RUN_AS == RUNTIME_UID


def test_gpu_image_prebuilds_deepspeed_ops_and_owns_the_extension_cache() -> None:
    text = read(IMAGES / "gpu" / "Dockerfile")
    runs = " ".join(args for keyword, args in instructions(text) if keyword == "RUN")
    assert re.search(r"DS_BUILD_\w+=1", runs), "no DeepSpeed op is built ahead of time"
    assert "--no-build-isolation" in runs and "DS_ACCELERATOR=cuda" in runs
    cache = env_value(text, "TORCH_EXTENSIONS_DIR")
    assert cache and re.search(
        rf"chown\s+(-R\s+)?{RUNTIME_UID}(:{RUNTIME_UID})?\s+{re.escape(cache)}", runs
    )
    assert "g++" in runs
    assert "deepspeed" in lock_pins() and "ninja" in lock_pins()


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=ids(DOCKERFILES))
def test_build_context_is_narrowed_by_a_dockerignore(dockerfile: Path) -> None:
    ignore = dockerfile.with_name("Dockerfile.dockerignore").read_text().splitlines()
    assert ignore.index("*") < ignore.index("!src"), "everything must be excluded first"
    for copied in ("!pyproject.toml", "!src", "!images/requirements.lock"):
        assert copied in ignore
