"""``fedtune bench system`` end to end on the CI preset (no DeepSpeed: see the slow test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedtune.benchmarks.server_memory import ServerMemorySpec, measure
from fedtune.cli.main import main


def test_system_bench_measures_side_by_side(ci_workspace: Path) -> None:
    assert main(["bench", "system", "--out", str(ci_workspace), "--preset", "ci"]) == 0
    results = json.loads((ci_workspace / "system" / "results.json").read_text())
    assert results["device"]["description"].startswith(("CPU", "CUDA"))
    client = results["client_step"]
    # The engine's client step and the bare loop trained the same adapter on the same batches.
    assert client["max_abs_diff"] == 0.0
    assert len(client["pairs"]) == 2 and client["tokens"] > 0
    assert client["ratio"] > 0 and client["platform_tokens_per_s"] > 0
    assert client["verdict"].startswith(("Aim met", "Aim missed"))
    assert results["engine"]["num_rounds"] == 2 and results["engine"]["steady_overhead"] >= 1.0
    sizes = {row["algorithm"]: row for row in results["bytes"]}
    assert sizes["fedavg"]["update_vs_trainable"] == 1.0
    # SCAFFOLD also sends its control-variate delta: exactly twice the adapter.
    assert sizes["scaffold"]["update_vs_trainable"] == 2.0
    for row in sizes.values():
        assert row["update_bytes"] > row["update_raw_bytes"]
        assert row["fixed_overhead_bytes"] == row["update_bytes"] - row["update_raw_bytes"]
        if row["update_ratio"] > 1.01:
            assert any(note.startswith(row["algorithm"] + ":") for note in results["notes"])
    (plain,) = results["server_memory"]["rows"]
    assert plain["mode"] == "plain" and plain["peak_mib"] > plain["added_mib"] > 0
    markdown = (ci_workspace / "system" / "results.md").read_text()
    assert "bare PyTorch + PEFT" in markdown and "| scaffold |" in markdown


def test_unknown_part_is_rejected(ci_workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "system", "--out", str(ci_workspace), "--preset", "ci", "--parts", "gpu"])
    assert code == 2
    assert "gpu" in capsys.readouterr().err


@pytest.mark.slow
def test_zero3_server_step_runs_and_reports_memory(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    spec = ServerMemorySpec(
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        intermediate_size=64,
        batch_size=2,
        seq_len=16,
        steps=2,
        zero3_ranks=(1,),
    )
    rows = measure(spec, tmp_path)["rows"]
    assert [(r["mode"], r["ranks"]) for r in rows] == [("plain", 1), ("zero3", 1)]
    assert all("error" not in r for r in rows), rows
    assert all(r["peak_mib"] > 0 for r in rows)


def test_engine_bench_still_reports_from_a_job_file(tmp_path: Path) -> None:
    report_path = tmp_path / "engine.json"
    code = main(
        ["bench", "engine", "examples/quickstart.yaml", "--rounds", "2", "--no-progress",
         "--json", str(report_path)]
    )
    assert code == 0
    report = json.loads(report_path.read_text())
    assert [r["round"] for r in report["rounds"]] == [1, 2]
    assert report["steady_overhead"] >= 1.0 and report["bytes_ratio"] > 1.0


@pytest.mark.slow
def test_peer_bench_times_fedtune_with_workers_against_the_bare_loop(ci_workspace: Path) -> None:
    args = ["bench", "system", "--out", str(ci_workspace), "--preset", "ci", "--parts", "peer"]
    assert main(args) == 0
    peer = json.loads((ci_workspace / "system" / "results.json").read_text())["peer"]
    (job,) = peer["jobs"]
    runs = [row["run"] for row in job["rows"]]
    assert runs == ["bare", "compute-only floor", "fedtune, 1 worker(s)", "fedtune, 2 worker(s)"]
    assert all(row["seconds"] > 0 for row in job["rows"])
    assert job["rows"][0]["ratio"] == 1.0 and job["rows"][1]["floor_ratio"] == 1.0
    one = job["rows"][2]
    # The aim is against the compute-only floor, not the bare loop (which reading and
    # tokenizing flatter).
    assert one["aim"] == 1.15 and one["aim_of"] == "compute-only floor"
    assert one["met"] == (one["floor_ratio"] <= 1.15)
    assert one["floor_ratio"] == pytest.approx(one["seconds"] / job["rows"][1]["seconds"])
    # Peak resident memory of the engine process, and of each worker for the N-worker run.
    bare, floor, one, two = job["rows"]
    assert "engine_peak_rss_mib" not in bare and "engine_peak_rss_mib" not in floor
    assert one["engine_peak_rss_mib"] > 100 and "workers_peak_rss_mib" not in one
    assert two["engine_peak_rss_mib"] > 100
    assert len(two["workers_peak_rss_mib"]) == 2 and min(two["workers_peak_rss_mib"]) > 100
    markdown = (ci_workspace / "system" / "results.md").read_text()
    assert "Peer job 'tiny' vs a bare sequential PyTorch + PEFT loop" in markdown
    assert "<= 1.15 x floor (m" in markdown
    assert "peak RSS MiB (engine; workers) |" in markdown
    assert "| run | seconds | / bare | / floor | aim |" in markdown
    peaks = ", ".join(f"{w:,.0f}" for w in two["workers_peak_rss_mib"])
    assert f"{two['engine_peak_rss_mib']:,.0f}; {peaks} |" in markdown


def test_peer_memory_is_a_column_only_where_it_was_recorded() -> None:
    from fedtune.benchmarks.peer import FLOOR
    from fedtune.benchmarks.report import system_markdown

    recorded = json.loads(Path("docs/results/peer-system.json").read_text())
    for job in recorded["peer"]["jobs"]:  # as results recorded before memory and the floor
        job["rows"] = [row for row in job["rows"] if row["run"] != FLOOR]
        for row in job["rows"]:
            row.pop("engine_peak_rss_mib", None)
            row.pop("workers_peak_rss_mib", None)
            row.pop("floor_ratio", None)
            row.pop("aim_of", None)
    before = system_markdown(recorded)
    assert "peak RSS" not in before  # recorded without memory: the table as it was
    assert " x bare (m" in before and " x floor (" not in before  # aims were against bare
    rows = recorded["peer"]["jobs"][1]["rows"]  # the larger job: bare, 1 and 2 workers
    rows[1]["engine_peak_rss_mib"] = 812.4
    rows[2] |= {"engine_peak_rss_mib": 640.0, "workers_peak_rss_mib": [1210.6, 1190.2]}
    after = system_markdown(recorded)
    assert "| run | seconds | / bare | aim | peak RSS MiB (engine; workers) |" in after
    assert "| - |" in after and "| 812 |" in after and "| 640; 1,211, 1,190 |" in after
    assert "/ floor" not in after  # recorded before the floor: no such column
    for row in rows:
        row["floor_ratio"] = row["seconds"] / 10.0
    assert f"| {rows[1]['floor_ratio']:.3f} |" in system_markdown(recorded)


def test_an_unknown_part_is_refused(ci_workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "system", "--out", str(ci_workspace), "--preset", "ci", "--parts", "gpu"]) != 0
    assert "peer" in capsys.readouterr().err


def test_recording_rewrites_only_the_generated_block(tmp_path: Path) -> None:
    from fedtune.benchmarks.report import record

    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "bench.md"
    marker = "<!-- generated: system docs/results/x.json -->"
    page.write_text(f"# Title\n\n{marker}\nold table\n<!-- end generated -->\n\nProse.\n")
    results = {"device": {"description": "CPU test", "torch": "2", "threads": 1}}
    assert record(results, tmp_path / "docs" / "results" / "x.json") == [page]
    text = page.read_text()
    assert "old table" not in text and "Device: CPU test" in text
    assert text.startswith("# Title\n") and text.endswith("<!-- end generated -->\n\nProse.\n")
    assert json.loads((tmp_path / "docs" / "results" / "x.json").read_text()) == results
