"""HumanEval scoring: canonical solutions pass, broken completions fail, pass@k is unbiased."""

from __future__ import annotations

import gzip
import json
from math import comb
from pathlib import Path

import pytest

from fedtune.core.errors import ConfigError, DataError
from fedtune.eval.humaneval import (
    Problem,
    check_completion,
    evaluate_samples,
    load_problems,
    pass_at_k,
    score_file,
)


@pytest.fixture(scope="module")
def problems() -> dict[str, Problem]:
    return load_problems()


@pytest.fixture(scope="module")
def subset(problems: dict[str, Problem]) -> dict[str, Problem]:
    """20 problems spread over the whole set."""
    ids = [f"HumanEval/{i}" for i in range(0, 164, 8)][:20]
    return {task_id: problems[task_id] for task_id in ids}


def test_the_wheel_ships_164_problems(problems: dict[str, Problem]) -> None:
    assert len(problems) == 164
    assert problems["HumanEval/0"].entry_point == "has_close_elements"


def test_canonical_solutions_score_one_on_a_subset(subset: dict[str, Problem]) -> None:
    samples = [{"task_id": t, "completion": p.canonical_solution} for t, p in subset.items()]
    report = evaluate_samples(samples, problems=subset)
    assert report["pass@1"] == 1.0
    assert report["num_tasks"] == 20
    assert report["status_counts"] == {"passed": 20}


@pytest.mark.slow
def test_canonical_solutions_score_one_on_all_164(problems: dict[str, Problem]) -> None:
    samples = [{"task_id": t, "completion": p.canonical_solution} for t, p in problems.items()]
    report = evaluate_samples(samples)
    assert report["pass@1"] == 1.0, [r for r in report["results"] if r["status"] != "passed"]
    assert report["num_tasks"] == 164


def test_empty_bodies_score_zero(subset: dict[str, Problem]) -> None:
    samples = [{"task_id": t, "completion": "    pass\n"} for t in subset]
    report = evaluate_samples(samples, problems=subset)
    assert report["pass@1"] == 0.0
    assert all(r["status"] in ("failed", "error") for r in report["results"])


def test_mixed_samples_give_the_unbiased_estimate(problems: dict[str, Problem]) -> None:
    a, b = problems["HumanEval/2"], problems["HumanEval/4"]
    samples = (
        [{"task_id": a.task_id, "completion": a.canonical_solution}] * 2
        + [{"task_id": a.task_id, "completion": "    return None\n"}] * 3
        + [{"task_id": b.task_id, "completion": b.canonical_solution}] * 5
    )
    report = evaluate_samples(samples, k_values=(1, 2), problems=problems)
    assert report["tasks"] == {a.task_id: {"n": 5, "c": 2}, b.task_id: {"n": 5, "c": 5}}
    assert report["pass@1"] == pytest.approx((2 / 5 + 1.0) / 2)
    assert report["pass@2"] == pytest.approx((1 - comb(3, 2) / comb(5, 2) + 1.0) / 2)
    assert [r["task_id"] for r in report["results"]] == [s["task_id"] for s in samples]
    json.dumps(report)  # the CLI prints it


def test_a_completion_that_loops_forever_times_out(problems: dict[str, Problem]) -> None:
    result = check_completion(
        problems["HumanEval/0"], "    while True:\n        pass\n", timeout_s=0.5
    )
    assert (result.passed, result.status) == (False, "timeout")
    assert "wall-time" in result.detail


def test_the_cpu_time_limit_ends_a_busy_program(problems: dict[str, Problem]) -> None:
    # The program lowers its own CPU limit below the wall limit, so the CPU limit fires first.
    completion = (
        "    import resource\n"
        "    resource.setrlimit(resource.RLIMIT_CPU, (1, 1))\n"
        "    while True:\n        pass\n"
    )
    result = check_completion(problems["HumanEval/0"], completion, timeout_s=10)
    assert (result.passed, result.status) == (False, "timeout")
    assert "CPU-time" in result.detail


def test_a_completion_that_opens_a_socket_fails(problems: dict[str, Problem]) -> None:
    p = problems["HumanEval/0"]
    completion = "    import socket\n    socket.create_connection(('127.0.0.1', 9))\n"
    result = check_completion(p, completion + p.canonical_solution)
    assert not result.passed
    assert result.status == "error"
    assert "network access" in result.detail


def test_a_raw_socket_fails_too(problems: dict[str, Problem]) -> None:
    p = problems["HumanEval/0"]
    result = check_completion(
        p, "    import _socket\n    _socket.socket()\n" + p.canonical_solution
    )
    assert not result.passed and "network access" in result.detail


def test_a_completion_that_starts_a_process_fails(problems: dict[str, Problem]) -> None:
    p = problems["HumanEval/0"]
    completion = "    import subprocess\n    subprocess.run(['true'])\n" + p.canonical_solution
    result = check_completion(p, completion)
    assert not result.passed and "starting processes" in result.detail


def test_a_completion_that_allocates_too_much_memory_fails(problems: dict[str, Problem]) -> None:
    p = problems["HumanEval/0"]
    # Allocated once, on the first call: the tests call the function several times.
    completion = (
        "    if '_block' not in globals():\n"
        "        globals()['_block'] = bytearray(400 * 1024 * 1024)\n" + p.canonical_solution
    )
    limited = check_completion(p, completion, memory_mb=256)
    assert (limited.passed, limited.status) == (False, "error")
    assert "MemoryError" in limited.detail
    # The same code passes when the limit allows it: the limit, not the code, made it fail.
    # Touching 400 MiB is slow on a busy machine: a long wall limit keeps this about memory.
    assert check_completion(p, completion, timeout_s=60, memory_mb=1024).passed


@pytest.mark.parametrize("exit_call", ["import sys; sys.exit(0)", "import os; os._exit(0)"])
def test_exiting_before_the_tests_is_not_a_pass(
    problems: dict[str, Problem], exit_call: str
) -> None:
    p = problems["HumanEval/0"]
    result = check_completion(p, f"    {exit_call}\n")
    assert not result.passed and result.status == "error"


def test_a_syntax_error_is_reported(problems: dict[str, Problem]) -> None:
    result = check_completion(problems["HumanEval/0"], "    return (\n")
    assert result.status == "error" and "SyntaxError" in result.detail


def test_the_program_runs_in_a_fresh_directory_without_our_environment(
    problems: dict[str, Problem], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak")
    p = problems["HumanEval/0"]
    completion = (
        "    import os\n"
        "    assert 'AWS_SECRET_ACCESS_KEY' not in os.environ, 'credential leaked'\n"
        "    assert os.listdir('.') == ['program.py'], os.listdir('.')\n" + p.canonical_solution
    )
    result = check_completion(p, completion)
    assert result.passed, result.detail


def test_a_failed_assertion_names_the_test_line(problems: dict[str, Problem]) -> None:
    result = check_completion(problems["HumanEval/0"], "    return False\n")
    assert result.status == "failed"
    assert "assert candidate(" in result.detail


@pytest.mark.parametrize("n", [1, 2, 5, 10, 20])
def test_pass_at_k_matches_the_combinatorial_formula(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            naive = 1.0 - comb(n - c, k) / comb(n, k)
            assert pass_at_k(n, c, k) == pytest.approx(naive, abs=1e-12)


def test_pass_at_k_is_stable_for_large_n() -> None:
    # comb(2000, 100) overflows a float; the product form does not.
    assert 0.0 < pass_at_k(2000, 3, 100) < 1.0
    assert pass_at_k(5, 1, 1) == pytest.approx(0.2)


@pytest.mark.parametrize(("n", "c", "k"), [(5, 1, 6), (5, 6, 1), (5, 1, 0), (0, 0, 1)])
def test_pass_at_k_rejects_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ConfigError, match=f"n={n}, c={c}, k={k}"):
        pass_at_k(n, c, k)


def test_unknown_task_id_is_a_data_error(subset: dict[str, Problem]) -> None:
    with pytest.raises(DataError, match="unknown task_id 'HumanEval/999'"):
        evaluate_samples(
            [{"task_id": "HumanEval/999", "completion": "    pass\n"}], problems=subset
        )


@pytest.mark.parametrize(
    "sample",
    [{"task_id": "HumanEval/0"}, {"completion": "x"}, {"task_id": 0, "completion": "x"}, "text"],
)
def test_malformed_sample_is_a_data_error(sample: object, subset: dict[str, Problem]) -> None:
    with pytest.raises(DataError, match="sample 0"):
        evaluate_samples([sample], problems=subset)  # type: ignore[list-item]


def test_no_samples_is_a_data_error(subset: dict[str, Problem]) -> None:
    with pytest.raises(DataError, match="no samples"):
        evaluate_samples([], problems=subset)


def test_k_above_the_sample_count_is_a_config_error(subset: dict[str, Problem]) -> None:
    samples = [{"task_id": "HumanEval/0", "completion": "    pass\n"}] * 2
    with pytest.raises(ConfigError, match=r"k=\[5\]") as info:
        evaluate_samples(samples, k_values=(1, 5), problems=subset)
    assert "<= 2" in info.value.fix


def test_zero_workers_is_a_config_error(subset: dict[str, Problem]) -> None:
    with pytest.raises(ConfigError, match="workers=0"):
        evaluate_samples([{"task_id": "HumanEval/0", "completion": ""}], workers=0, problems=subset)


def test_bad_sandbox_limits_are_a_config_error(subset: dict[str, Problem]) -> None:
    with pytest.raises(ConfigError, match="timeout_s=0"):
        check_completion(subset["HumanEval/0"], "    pass\n", timeout_s=0)


@pytest.mark.parametrize("gzipped", [False, True])
def test_score_file_reads_a_samples_file(
    tmp_path: Path, problems: dict[str, Problem], gzipped: bool
) -> None:
    lines = [
        json.dumps(
            {"task_id": "HumanEval/0", "completion": problems["HumanEval/0"].canonical_solution}
        ),
        json.dumps({"task_id": "HumanEval/1", "completion": "    return []\n"}),
    ]
    payload = ("\n".join(lines) + "\n").encode()
    path = tmp_path / ("samples.jsonl.gz" if gzipped else "samples.jsonl")
    path.write_bytes(gzip.compress(payload) if gzipped else payload)
    report = score_file(path, k_values=(1,))
    assert report["pass@1"] == pytest.approx(0.5)
    assert report["tasks"] == {"HumanEval/0": {"n": 1, "c": 1}, "HumanEval/1": {"n": 1, "c": 0}}


def test_score_file_reports_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "samples.jsonl"
    path.write_text('{"task_id": "HumanEval/0", "completion": ""}\n{not json\n')
    with pytest.raises(DataError, match="line 2"):
        score_file(path)


def test_score_file_missing_file_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found"):
        score_file(tmp_path / "absent.jsonl")


def test_a_custom_problem_file_is_loaded(tmp_path: Path) -> None:
    problem = {
        "task_id": "Mine/0",
        "prompt": "def double(x):\n",
        "entry_point": "double",
        "canonical_solution": "    return 2 * x\n",
        "test": "def check(candidate):\n    assert candidate(3) == 6\n",
    }
    path = tmp_path / "problems.jsonl"
    path.write_text(json.dumps(problem) + "\n")
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"task_id": "Mine/0", "completion": "    return x + x\n"}) + "\n")
    assert score_file(samples, problems_path=path)["pass@1"] == 1.0


def test_a_problem_missing_a_field_is_a_data_error(tmp_path: Path) -> None:
    path = tmp_path / "problems.jsonl"
    path.write_text(json.dumps({"task_id": "Mine/0", "prompt": "def f():\n"}) + "\n")
    with pytest.raises(DataError, match="line 1.*'entry_point'"):
        load_problems(path)


def test_an_empty_problem_file_is_a_data_error(tmp_path: Path) -> None:
    path = tmp_path / "problems.jsonl"
    path.write_text("\n")
    with pytest.raises(DataError, match="holds no HumanEval problems"):
        load_problems(path)
