"""FewFedPIT's synthesis counts per client step, read from a job summary's rounds."""

from __future__ import annotations

from fedtune.benchmarks.synthesis_steps import COUNTS, synthesis_lines, synthesis_steps


def _step(kept: int, trained: bool) -> dict[str, object]:
    metrics = {
        "fewfedpit/instruction_prompts": 9.0, "fewfedpit/rejected_format": 2.0,
        "fewfedpit/rejected_similar_instruction": 3.0, "fewfedpit/rejected_unparsed": 1.0,
        "fewfedpit/rejected_similar_example": 0.0, "fewfedpit/candidates": 3.0,
    }
    if kept:
        metrics["fewfedpit/kept"] = float(kept)
    if trained:
        metrics["fewfedpit/synthetic_steps"] = 4.0
    return {"metrics": metrics}


def test_every_fewfedpit_step_is_one_entry_and_used_means_trained_on() -> None:
    rounds = [
        {"round": 1, "tenants": {"t-b": _step(2, True), "t-a": {"metrics": {}}}},
        # Kept by IFS but every kept example too long: nothing trained on.
        {"round": 2, "tenants": {"t-a": _step(1, False), "t-c": _step(0, False)}},
    ]
    steps = synthesis_steps(rounds)
    assert [(s["round"], s["tenant"]) for s in steps] == [(1, "t-b"), (2, "t-a"), (2, "t-c")]
    assert [(s["kept"], s["used"]) for s in steps] == [(2, 2), (1, 0), (0, 0)]
    assert all(set(COUNTS) <= set(s) and s["generated"] == 9 and s["passed"] == 3 for s in steps)
    lines = synthesis_lines({"runs": [{"method": "fewfedpit", "synthesis_steps": steps}, {"method": "fedavg"}]})
    assert lines[-1] == "| fewfedpit | 3 | 9.0 | 2.0 | 3.0 | 1.0 | 0.0 | 3.0 | 1.0 | 0.7 | 1 (33%) |"
    assert synthesis_lines({"runs": [{"method": "fedavg"}]}) == []
