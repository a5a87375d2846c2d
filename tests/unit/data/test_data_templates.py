"""Prompt templates, compared with literal strings from the papers."""

from __future__ import annotations

import pytest

from fedtune.core.errors import ConfigError
from fedtune.data.formats import Example
from fedtune.data.templates import GSM8K_EXEMPLARS, gsm8k_few_shot_prompt, render_prompt

WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides "
    "further context. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\nSummarise the text.\n\n### Input:\nCats sleep a lot.\n\n### Response:\n"
)
NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n### Instruction:\nName a colour.\n\n### Response:\n"
)


@pytest.mark.parametrize(
    ("example", "expected"),
    [
        (Example("Summarise the text.", "Cats sleep a lot.", "ignored", None), WITH_INPUT),
        (Example("Name a colour.", "", "ignored", None), NO_INPUT),
        (Example("Name a colour.", "  \n", "ignored", None), NO_INPUT),
    ],
    ids=["with-input", "no-input", "whitespace-input"],
)
def test_render_prompt_is_exact(example: Example, expected: str) -> None:
    assert render_prompt(example) == expected


def test_braces_in_text_are_kept_verbatim() -> None:
    prompt = render_prompt(Example("Fill {x} in", "{input}", "", None))
    assert "### Instruction:\nFill {x} in\n\n### Input:\n{input}\n\n" in prompt


def test_gsm8k_eight_shot_prompt_starts_and_ends_exactly() -> None:
    prompt = gsm8k_few_shot_prompt("What is 1 + 1?")
    assert prompt.startswith(
        "Below is a set of demos followed by an instruction that describes a task. Write a "
        "response that appropriately completes the request.\n\n### Instruction:\nThere are 15 "
        "trees in the grove. Grove workers will plant trees in the grove today. After they are "
        "done, there will be 21 trees. How many trees did the grove workers plant today?\n\n"
        "### Response:\nThere are 15 trees originally. Then there were 21 trees after some more "
        "were planted. So there must have been 21 - 15 = 6. The answer is 6.\n\n"
    )
    assert prompt.endswith(
        "### Instruction:\nOlivia has $23. She bought five bagels for $3 each. How much money "
        "does she have left?\n\n### Response:\nOlivia had 23 dollars. 5 bagels for 3 dollars "
        "each will be 5 * 3 = 15 dollars. So she has 23 - 15 dollars left. 23 - 15 is 8. The "
        "answer is 8.\n\n### Instruction:\nWhat is 1 + 1?\n\n### Response:\n"
    )
    assert prompt.count("### Instruction:\n") == 9


def test_exemplars_are_the_papers_eight_with_consistent_answers() -> None:
    finals = [response.rsplit("The answer is ", 1)[1] for _, response in GSM8K_EXEMPLARS]
    assert finals == ["6.", "5.", "39.", "8.", "9.", "29.", "33.", "8."]
    assert all("$" not in response for _, response in GSM8K_EXEMPLARS)


@pytest.mark.parametrize("shots", [0, 1, 3, 8])
def test_shot_count_selects_the_first_exemplars(shots: int) -> None:
    prompt = gsm8k_few_shot_prompt("Q?", shots=shots)
    assert prompt.count("### Response:\n") == shots + 1
    for question, _ in GSM8K_EXEMPLARS[shots:]:
        assert question not in prompt


@pytest.mark.parametrize("shots", [-1, 9])
def test_shot_count_out_of_range_is_a_config_error(shots: int) -> None:
    with pytest.raises(ConfigError, match=f"shots={shots} is out of range"):
        gsm8k_few_shot_prompt("Q?", shots=shots)
