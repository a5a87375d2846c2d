"""Self-instruct demonstrations in the pretraining corpus: what FewFedPIT's generator is
taught to write passes FewFedPIT's own filters, and no demonstration shows a test record."""

from __future__ import annotations

import dataclasses
import re

import pytest

from fedtune.algorithms.fewfedpit import filters, prompts
from fedtune.algorithms.fewfedpit.config import FewFedPITConfig
from fedtune.benchmarks.self_instruct import SELF_INSTRUCT, encode_raw, is_raw
from fedtune.benchmarks.suite import SuiteSpec, build_suite
from fedtune.data.formats import Example
from fedtune.data.tokenize import IGNORE_INDEX

SPEC = SuiteSpec(private_records=200, public_records=200, pretrain_records=400, self_instruct_records=400)
CONFIG = FewFedPITConfig(name="fewfedpit")
_BLOCK = re.compile(r"Instruction: (.*)\nInput: ((?:.|\n)*?)\nOutput: (.*)")


@pytest.fixture(scope="module")
def suite():  # type: ignore[no-untyped-def]
    return build_suite(SPEC)


def _shown_tasks(prompt: str) -> list[str]:
    return [line.split(": ", 1)[1] for line in prompt.splitlines() if re.match(r"Task \d+: ", line)]


def _shown_examples(prompt: str) -> list[Example]:
    blocks = prompt.split("\n\n")[1:-1]  # header first, the new instruction last
    examples = []
    for block in blocks:
        match = _BLOCK.fullmatch(block)
        assert match, block
        given = "" if match[2] == prompts.NO_INPUT else match[2]
        examples.append(Example(match[1], given, match[3]))
    return examples


def test_every_demonstration_continues_past_fewfedpits_filters(suite) -> None:  # type: ignore[no-untyped-def]
    demos = [r for r in suite.pretrain if is_raw(r)]
    assert len(demos) == SPEC.self_instruct_records
    kinds = {"instruction": 0, "example": 0}
    for record in demos:
        prompt, continuation = record["instruction"], record["response"]
        if prompt.startswith(prompts.instruction_prompt([])[:40]):
            kinds["instruction"] += 1
            shown = _shown_tasks(prompt)
            assert shown and prompt == prompts.instruction_prompt(shown)
            new = prompts.parse_instruction(continuation)
            assert filters.format_ok(new, CONFIG.min_instruction_words), new
            assert not filters.too_similar(new, shown, CONFIG.similarity_threshold), (new, shown)
        else:
            kinds["example"] += 1
            shown_examples = _shown_examples(prompt)
            instruction = prompt.rsplit("Instruction: ", 1)[1].removesuffix("\nInput:")
            assert prompt == prompts.example_prompt(shown_examples, instruction)
            example = prompts.parse_example(instruction, continuation)
            assert example is not None and example.response, continuation
            local = [filters.example_text(e) for e in shown_examples]
            assert not filters.too_similar(filters.example_text(example), local, CONFIG.similarity_threshold)
    assert min(kinds.values()) > len(demos) / 3


def test_no_demonstration_shows_a_test_or_validation_record(suite) -> None:  # type: ignore[no-untyped-def]
    held_out = {(r["instruction"], r["context"]) for r in suite.test + suite.validation}
    no_context = {i for i, c in held_out if not c}
    for record in suite.pretrain:
        if not is_raw(record):
            continue
        prompt = record["instruction"]
        assert not set(_shown_tasks(prompt)) & no_context
        if "\nOutput: " in prompt:
            assert not {(e.instruction, e.input) for e in _shown_examples(prompt)} & held_out
        new = prompts.parse_instruction(record["response"])
        assert new not in no_context


def test_demonstrations_are_seeded_and_a_share_of_the_corpus(suite) -> None:  # type: ignore[no-untyped-def]
    assert build_suite(SPEC).pretrain == suite.pretrain
    other = build_suite(dataclasses.replace(SPEC, seed=1)).pretrain
    assert [r for r in other if is_raw(r)] != [r for r in suite.pretrain if is_raw(r)]
    default = SuiteSpec()
    share = default.self_instruct_records / (
        default.public_records + default.pretrain_records + default.self_instruct_records
    )
    # 3,000 of 43,600 (7 %): enough that FewFedPIT's generator sees each prompt's shape often
    # (200 of 200 client steps used synthetic data with 3,000 of 15,600), few enough that the
    # suite's tasks dominate what the bases learn.
    assert default.self_instruct_records == 3000 and 0.05 <= share <= 0.25
    # Counting stays out of pretraining (the tenants' task to teach).
    assert not any("How many times" in r["response"] for r in suite.pretrain if is_raw(r))


def test_a_demonstration_is_encoded_as_the_generator_reads_it(suite) -> None:  # type: ignore[no-untyped-def]
    from fedtune.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("builtin")
    record = next(r for r in suite.pretrain if r["category"] == SELF_INSTRUCT)
    encoded = encode_raw(record, tokenizer, 1024)
    assert encoded is not None
    prompt = tokenizer(record["instruction"], add_special_tokens=True)["input_ids"]
    assert encoded["input_ids"][: len(prompt)] == prompt
    trained = [t for t in encoded["labels"] if t != IGNORE_INDEX]
    assert trained[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(trained[:-1]) == record["response"]
    assert all(t == IGNORE_INDEX for t in encoded["labels"][: len(prompt)])
    assert encode_raw(record, tokenizer, len(prompt)) is None  # no room for the continuation
