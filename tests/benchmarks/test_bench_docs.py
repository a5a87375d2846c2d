"""docs/benchmarks.md's result tables are generated from the committed results JSONs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fedtune.benchmarks.docs import DOC, main, regenerate
from fedtune.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_regenerating_the_page_changes_nothing() -> None:
    text = (ROOT / DOC).read_text("utf-8")
    assert "<!-- generated: quality docs/results/" in text
    assert regenerate(text, ROOT) == text, "run python -m fedtune.benchmarks.docs --write"


def test_every_block_names_its_commit() -> None:
    text = regenerate((ROOT / DOC).read_text("utf-8"), ROOT)
    # The claims summary names no commit of its own: each table it reads names its own; nor
    # does a GPU block whose JSON no lease has written yet.
    blocks = (text.splitlines().count("<!-- end generated -->") - text.count("<!-- generated: claims ")
              - text.count("\nNot yet measured on a GPU: "))
    assert blocks >= 5
    assert text.count("(measured at commit ") == blocks
    assert "(measured at commit unknown)" not in text


def test_every_results_file_is_shown_by_a_generated_block() -> None:
    # A results JSON no table is generated from is a number nobody can see or check.
    text = (ROOT / DOC).read_text("utf-8")
    shown = set(re.findall(r"<!-- generated: \w+ docs/results/(\S+\.json)(?: commit=\w+)? -->", text))
    committed = {path.name for path in (ROOT / "docs" / "results").glob("*.json")}
    assert committed - shown == set(), f"results with no generated block in {DOC}"


def test_a_stale_page_is_reported_and_rewritten(tmp_path: Path) -> None:
    (tmp_path / "docs" / "results").mkdir(parents=True)
    source = ROOT / "docs" / "results" / "fedpt-alpha.json"
    # A JSON measured before commits were recorded: the marker names its commit.
    results = json.loads(source.read_text("utf-8"))
    results.pop("commit", None)
    results.get("provenance", {}).pop("measured_at_commit", None)
    (tmp_path / "docs" / "results" / "a.json").write_text(json.dumps(results), "utf-8")
    page = tmp_path / DOC
    page.write_text("intro\n<!-- generated: quality docs/results/a.json commit=abc1234 -->\nold numbers\n<!-- end generated -->\nafter\n", "utf-8")
    assert main(["--root", str(tmp_path)]) == 1
    assert main(["--root", str(tmp_path), "--write"]) == 0
    text = page.read_text("utf-8")
    assert "old numbers" not in text and "fedavg-pt@alpha=2" in text
    assert "(measured at commit abc1234)" in text and text.endswith("after\n")
    assert main(["--root", str(tmp_path)]) == 0


def test_a_block_naming_a_missing_json_is_an_error(tmp_path: Path) -> None:
    text = "<!-- generated: quality docs/results/nope.json -->\n<!-- end generated -->\n"
    with pytest.raises(ConfigError, match="nope.json") as info:
        regenerate(text, tmp_path)
    assert "Commit the results JSON" in info.value.fix


def test_the_claims_summary_lists_every_tables_claims_with_the_same_verdict() -> None:
    """Each quality table's own ordering rows reappear at the top, verdict for verdict, and
    each row links to a heading that exists on the page."""
    from fedtune.benchmarks.claims_page import _anchor

    text = (ROOT / DOC).read_text("utf-8")
    summary = text.split("<!-- generated: claims ", 1)[1].split("<!-- end generated -->", 1)[0]
    rows = [line.split(" | ") for line in summary.splitlines() if line.startswith("| ") and "**" in line]
    anchors = {_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)}
    seen = {(r[1], r[2].strip("*"), r[6].rsplit("`", 2)[1]) for r in rows}
    checked = 0
    for block in re.finditer(
        r"^<!-- generated: quality docs/results/(\S+)(?: commit=\w+)? -->$(.*?)<!-- end generated -->",
        text,
        re.MULTILINE | re.DOTALL,
    ):
        for line in block.group(2).splitlines():
            cells = [c.strip() for c in line.strip("|").split("|")]
            verdicts = {"reproduces", "reversed", "within noise", "differs", "single seed"}
            if len(cells) == 6 and (cells[-1] in verdicts or cells[-1].startswith("no verdict: premise ")):
                assert (cells[0], cells[-1], block.group(1)) in seen, (cells, block.group(1))
                checked += 1
    assert checked == len(rows) > 20
    for row in rows:
        assert re.search(r"\]\((#[^)]+)\)", row[6]).group(1) in anchors, row[6]


# Machine-load anecdotes and internal tracker numbers say nothing a reader can check or use.
_NOT_FOR_READERS = re.compile(
    r"\bissues? \d+|(?<![&\w])#\d+\b|load average|\bload \d|\bbusy\b|nice \d+"
    r"|\b(?:other|this|\w+ other|by \w+) sessions?\b",
    re.IGNORECASE,
)


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_the_docs_tell_no_machine_load_anecdotes_nor_tracker_numbers(page: Path) -> None:
    """Hand-written prose and every generated block (rendered afresh from the JSONs, which
    may record the machine's load) alike."""
    text = regenerate(page.read_text("utf-8"), ROOT)
    found = [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in _NOT_FOR_READERS.finditer(text)]
    assert found == [], f"{page.name}: (line, text) {found}"
