"""FewFedPIT's synthetic-data prompts (paper 004, Section 3.3 and Appendix B, Fig. 6).

Written for fedtune after the paper's procedure (itself adapted from Self-Instruct): a new
instruction is asked for after eight numbered local instructions; an input and a response
are asked for after four local examples, half with an input and half without, alternating,
followed by the new instruction. Generation is greedy; the parsers below read the first
answer and ignore whatever the model writes after it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from fedtune.data.formats import Example

NO_INPUT = "<noinput>"

_INSTRUCTION_HEADER = (
    "Come up with a new task. Write one instruction, different from the tasks below, on one "
    "line.\n\n"
)
_EXAMPLE_HEADER = (
    "For each task, write an input if the task needs one (otherwise " + NO_INPUT + "), then "
    "the correct output.\n\n"
)
_TASK_PREFIX = re.compile(r"^\s*(?:task\s*\d+\s*[:.)-]|\d+\s*[:.)-])\s*", re.IGNORECASE)


def instruction_prompt(demonstrations: Sequence[str]) -> str:
    """Numbered local instructions, then the number of the one to write."""
    lines = [f"Task {i}: {_one_line(text)}" for i, text in enumerate(demonstrations, 1)]
    return _INSTRUCTION_HEADER + "\n".join(lines) + f"\nTask {len(demonstrations) + 1}:"


def parse_instruction(generated: str) -> str:
    """The first line of the continuation, without a ``Task N:`` prefix."""
    first = generated.strip().split("\n", 1)[0]
    return _TASK_PREFIX.sub("", first).strip()


def alternate_by_input(examples: Sequence[Example], count: int) -> list[Example]:
    """Up to ``count`` demonstrations, alternating with-input and without-input examples
    (starting with-input) while both kinds last, then whichever kind remains."""
    with_input = [e for e in examples if e.input.strip()]
    without = [e for e in examples if not e.input.strip()]
    chosen: list[Example] = []
    while len(chosen) < count and (with_input or without):
        first, second = (with_input, without) if len(chosen) % 2 == 0 else (without, with_input)
        chosen.append((first or second).pop(0))
    return chosen


def example_prompt(demonstrations: Sequence[Example], instruction: str) -> str:
    """Demonstrations as Instruction / Input / Output blocks, then the new instruction."""
    blocks = [_block(e.instruction, e.input, e.response) for e in demonstrations]
    blocks.append(f"Instruction: {_one_line(instruction)}\nInput:")
    return _EXAMPLE_HEADER + "\n\n".join(blocks)


def parse_example(instruction: str, generated: str) -> Example | None:
    """``Input: ... Output: ...`` continuation as an example; None when there is no output."""
    text = generated.split("\nInstruction:", 1)[0]
    if "Output:" not in text:
        return None
    given, response = text.split("Output:", 1)
    response = response.split("\n\n", 1)[0].strip()
    given = given.strip()
    if given == NO_INPUT or not given:
        given = ""
    if not response:
        return None
    return Example(instruction=instruction, input=given, response=response, category="synthetic")


def _block(instruction: str, given: str, response: str) -> str:
    return (
        f"Instruction: {_one_line(instruction)}\nInput: {given.strip() or NO_INPUT}\n"
        f"Output: {response.strip()}"
    )


def _one_line(text: str) -> str:
    return " ".join(text.split())
