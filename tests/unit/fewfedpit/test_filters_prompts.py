"""FewFedPIT's filters and prompt parsers (paper 004, Section 3.3): one test per rule."""

from __future__ import annotations

import pytest

from fedtune.algorithms.fewfedpit import filters, prompts
from fedtune.data.formats import Example


@pytest.mark.parametrize(
    "instruction",
    [
        "As a doctor, list three symptoms of flu.",  # persona start (footnote 1)
        "as an assistant, write a haiku about rain",
        "Sorry, I cannot come up with a task here.",  # refusal start
        "I cannot write that.",
    ],
)
def test_format_filter_drops_personas_and_refusals(instruction: str) -> None:
    assert not filters.format_ok(instruction, min_words=3)


def test_format_filter_drops_short_instructions_and_keeps_good_ones() -> None:
    assert not filters.format_ok("Reverse it", min_words=3)
    assert filters.format_ok("Reverse the given word", min_words=3)


def test_format_filter_drops_text_without_letters() -> None:
    assert not filters.format_ok("12 + 34 = 46 ?", min_words=3)


def test_format_filter_drops_overlong_instructions() -> None:
    assert not filters.format_ok("word " * (filters.MAX_INSTRUCTION_WORDS + 1), min_words=3)


def test_similarity_filter_uses_rouge_l_above_the_threshold() -> None:
    local = ["Reverse the letters of the word apple."]
    # Same words, one changed: Rouge-L F = 6/7 = 0.857 > 0.7.
    assert filters.too_similar("Reverse the letters of the word pear.", local, 0.7)
    assert not filters.too_similar("Count the vowels in a sentence.", local, 0.7)
    # The comparison is strict: exactly at the threshold is kept.
    assert not filters.too_similar("a b", ["a b c d"], 2 / 3)


def test_example_similarity_compares_instruction_input_and_response() -> None:
    example = Example(instruction="Add", input="2 and 3", response="5")
    assert filters.example_text(example) == "Add 2 and 3 5"
    assert filters.example_text(Example("Add", "", "5")) == "Add 5"


def test_instruction_prompt_numbers_demonstrations_and_parser_reads_the_first_line() -> None:
    text = prompts.instruction_prompt(["Add two numbers.", "Name a fruit\nplease"])
    assert text.endswith("Task 1: Add two numbers.\nTask 2: Name a fruit please\nTask 3:")
    assert prompts.parse_instruction(" Spell a word backwards.\nTask 4: more") == (
        "Spell a word backwards."
    )
    assert prompts.parse_instruction("Task 9: Name a color.") == "Name a color."


def test_response_demonstrations_alternate_with_and_without_input() -> None:
    pool = [
        Example("w1", "", "r"),
        Example("w2", "", "r"),
        Example("i1", "x", "r"),
        Example("i2", "y", "r"),
        Example("w3", "", "r"),
    ]
    chosen = prompts.alternate_by_input(pool, 4)
    assert [e.instruction for e in chosen] == ["i1", "w1", "i2", "w2"]
    # One kind runs out: the other fills the rest.
    assert [e.instruction for e in prompts.alternate_by_input(pool[:2], 4)] == ["w1", "w2"]


def test_example_parser_reads_input_and_output_and_rejects_missing_output() -> None:
    parsed = prompts.parse_example("Add them.", " 2 and 3\nOutput: 5\n\nInstruction: next")
    assert parsed == Example("Add them.", "2 and 3", "5", category="synthetic")
    no_input = prompts.parse_example("Name a fruit.", f" {prompts.NO_INPUT}\nOutput: apple")
    assert no_input is not None and no_input.input == ""
    assert prompts.parse_example("Add them.", " 2 and 3\nthe answer is 5") is None
    assert prompts.parse_example("Add them.", " 2 and 3\nOutput:   \n\n") is None


def test_example_prompt_ends_where_the_model_writes_the_input() -> None:
    demos = [Example("Add", "1 2", "3"), Example("Name a fruit", "", "apple")]
    text = prompts.example_prompt(demos, "Name a color")
    assert f"Input: {prompts.NO_INPUT}\nOutput: apple" in text
    assert text.endswith("Instruction: Name a color\nInput:")
