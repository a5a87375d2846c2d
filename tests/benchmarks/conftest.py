"""One CI-preset benchmark workspace per test session: suite plus pretrained tiny models."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fedtune.cli.main import main


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models train far faster on one thread than on two OpenMP threads that wait for
    each other on a busy machine; the setting is restored after each module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def ci_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``fedtune bench pretrain --preset ci`` run once; later tests read and add to it."""
    root = tmp_path_factory.mktemp("bench")
    before = torch.get_num_threads()
    try:
        assert main(["bench", "pretrain", "--out", str(root), "--preset", "ci", "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(before)
    return root
