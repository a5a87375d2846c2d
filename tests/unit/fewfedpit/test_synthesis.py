"""SynGen's control flow (paper 004, Section 3.3) with a scripted generator.

The generator stands in for M^g so that each filter and the retry rule can be driven
exactly; the real model's generation is exercised by the whole-job tests.
"""

from __future__ import annotations

import random

from fedtune.algorithms.fewfedpit import synthesis
from fedtune.algorithms.fewfedpit.config import FewFedPITConfig
from fedtune.data.formats import Example

LOCAL = [
    Example(f"Reverse the letters of the word number {i}.", "" if i % 2 else "w", f"r{i}")
    for i in range(10)
]


def _config(**overrides: object) -> FewFedPITConfig:
    return FewFedPITConfig(**{"name": "fewfedpit", "candidates": 4, "keep": 2, **overrides})


class Scripted:
    """Answers instruction prompts from ``instructions`` and example prompts from ``examples``."""

    def __init__(self, instructions: list[str], examples: list[str]) -> None:
        self.instructions, self.examples = list(instructions), list(examples)
        self.calls: list[list[str]] = []

    def __call__(self, batch: list[str]) -> list[str]:
        self.calls.append(batch)
        source = self.instructions if batch[0].rstrip().endswith(":") and "Task" in batch[0] else self.examples
        return [source.pop(0) if source else "" for _ in batch]


def test_each_filter_counts_what_it_drops_and_good_examples_survive() -> None:
    generate = Scripted(
        instructions=[
            " As a teacher, explain gravity.",  # format: persona
            " Hi",  # format: too short
            " Reverse the letters of the word number 3.",  # too close to a local instruction
            " Name the capital city of France.",
            " Name the capital city of France.",  # too close to one already accepted
            " Count the vowels in the given sentence.",
        ],
        examples=[
            f" {'<noinput>'}\nOutput: Paris",
            " the quick brown fox\nOutput: 5",
        ],
    )
    report = synthesis.synthesize(LOCAL, generate, _config(generation_batch_size=6), random.Random(0))
    counts = report.counts()
    assert counts["rejected_format"] == 2 + 6  # two scripted, six empty answers of batch 2
    assert counts["rejected_similar_instruction"] == 2
    assert [e.instruction for e in report.candidates] == [
        "Name the capital city of France.",
        "Count the vowels in the given sentence.",
    ]
    assert report.candidates[0].input == "" and report.candidates[0].response == "Paris"
    assert report.candidates[1].input == "the quick brown fox"


def test_unparsed_or_copied_examples_are_retried_with_new_demonstrations() -> None:
    generate = Scripted(
        instructions=[" Name the capital city of France."],
        examples=[
            " nothing useful",  # no Output: -> retry
            " w\nOutput: r3",  # not close enough? instruction differs; keep below
        ],
    )
    config = _config(candidates=1, keep=1, retries=3)
    report = synthesis.synthesize(LOCAL, generate, config, random.Random(1))
    assert report.rejected_unparsed == 1
    assert len(report.candidates) == 1


def test_a_copied_local_example_is_dropped_after_the_last_retry() -> None:
    only = Example("Name the capital of France please.", "w", "Paris is the capital")
    generate = Scripted(
        instructions=[" Name a large city in France for me."],
        examples=[" w\nOutput: Paris is the capital"] * 10,
    )
    config = _config(candidates=1, keep=1, retries=2, instruction_demos=1, similarity_threshold=0.5)
    report = synthesis.synthesize([only], generate, config, random.Random(0))
    # The instruction passes (Rouge-L 0.29 <= 0.5); the example copies the local one's input
    # and response (Rouge-L 0.58 > 0.5): dropped on the first try and each of 2 retries.
    assert report.rejected_similar_instruction == 0
    assert report.rejected_similar_example == 3
    assert report.candidates == []


def test_by_default_an_instruction_is_discarded_after_three_failed_attempts() -> None:
    """Paper 004, Section 3.3: "we will discard the new instruction if it fails to generate a
    compliant sample three times" (three attempts, not a first try and three retries)."""
    generate = Scripted(instructions=[" Name the capital city of France."], examples=[])
    report = synthesis.synthesize(LOCAL, generate, _config(candidates=1, keep=1), random.Random(0))
    example_prompts = [b for b in generate.calls if not b[0].rstrip().endswith(":") or "Task" not in b[0]]
    assert report.rejected_unparsed == 3 and len(example_prompts) == 3
    assert report.candidates == []


def test_prompts_that_do_not_fit_the_context_drop_demonstrations() -> None:
    class Short(Scripted):
        def fits(self, prompt: str) -> bool:
            return prompt.count("Task ") <= 3  # at most two demonstrations plus the open slot

    generate = Short(instructions=[" Name the capital city of France."], examples=[" x\nOutput: y"])
    synthesis.synthesize(LOCAL, generate, _config(candidates=1, keep=1), random.Random(0))
    first_prompt = generate.calls[0][0]
    assert first_prompt.count("Task ") == 3
