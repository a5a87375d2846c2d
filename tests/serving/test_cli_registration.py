"""The serving commands are registered, documented, and cheap to import."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedtune.cli.main import build_parser, main
from fedtune.serving.gate import AUDIT_TAG, GATE_TAG


def test_promote_and_serve_local_are_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    args = parser.parse_args(["promote", "m", "--version", "2"])
    assert (args.alias, args.gpus, args.kserve_out) == ("champion", 1, None)
    args = parser.parse_args(["serve-local", "m@champion", "--prompt", "a", "--prompt", "b"])
    assert args.prompt == ["a", "b"] and args.max_new_tokens == 32
    with pytest.raises(SystemExit):
        main(["promote", "--help"])
    text = capsys.readouterr().out
    assert AUDIT_TAG in text and GATE_TAG in text and "--kserve-out" in text


def test_bad_options_fail_before_touching_mlflow(capsys: pytest.CaptureFixture[str]) -> None:
    # Nothing listens on these URIs; the options are refused first, with exit code 2.
    uri = "http://127.0.0.1:9"
    assert main(["promote", "m", "--version", "1", "--max-leakage", "2", "--tracking-uri", uri]) == 2
    assert "--max-leakage" in capsys.readouterr().err
    assert main(["serve-local", "m", "--prompt", "x", "--tracking-uri", uri]) == 2
    assert "names no alias or version" in capsys.readouterr().err
    assert main(["serve-local", "m@a", "--max-new-tokens", "0", "--tracking-uri", uri]) == 2
    assert "--max-new-tokens" in capsys.readouterr().err


def test_importing_the_commands_imports_neither_mlflow_nor_torch() -> None:
    code = (
        "import sys, fedtune.cli.serving, fedtune.serving.promotion, fedtune.serving.local_server;"
        "print(sorted(m for m in ('mlflow', 'torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"
