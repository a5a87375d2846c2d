"""`make demo` gives a model that answers: the README's prompt gets a non-empty, trained-form answer."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fedtune.cli.main import main

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _readme_prompt() -> str:
    text = (ROOT / "README.md").read_text("utf-8")
    found = re.search(r'serve-local quickstart@candidate \\\n\s+--prompt "([^"]+)"', text)
    assert found, "the README shows `fedtune serve-local quickstart@candidate --prompt ...`"
    return found.group(1)


def test_the_quickstart_model_answers_the_readme_prompt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompt = _readme_prompt()
    job = str(ROOT / "examples" / "quickstart.yaml")
    assert main(["run", job, "--set", f"workdir={tmp_path}", "--no-progress"]) == 0
    capsys.readouterr()
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    code = main(["serve-local", "quickstart@candidate", "--prompt", prompt, "--json",
                 "--tracking-uri", uri])
    assert code == 0
    answer = json.loads(capsys.readouterr().out.splitlines()[-1])["text"]
    assert answer.strip(), "the demo model answered nothing"
    assert "The answer is" in answer  # the arithmetic answer form it was trained on
