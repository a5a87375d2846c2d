"""Synthetic data generation of FewFedPIT's client step (paper 004, Section 3.3).

With the global model M^g and the tenant's few local examples:

1. New instructions: prompts with ``instruction_demos`` random local instructions; format
   filter; Rouge-L filter against every local instruction (and the ones already accepted);
   until ``candidates`` instructions or the attempt budget is spent.
2. Input and response per instruction: prompts with ``response_demos`` random local examples
   (alternating with and without input); a response that fails to parse or whose example is
   too close to a local one is retried with new demonstrations up to ``retries`` times, so
   ``retries + 1`` attempts in all: the default 2 is the paper's "we will discard the new
   instruction if it fails to generate a compliant sample three times".

All decoding is greedy and batched (Hugging Face ``generate``, KV-cached), bounded by
``max_new_tokens``. Randomness (which demonstrations) comes from the given ``random.Random``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fedtune.algorithms.fewfedpit import filters, prompts
from fedtune.algorithms.fewfedpit.config import FewFedPITConfig
from fedtune.data.formats import Example
from fedtune.eval.generation import generate_greedy

ATTEMPTS_PER_CANDIDATE = 3  # instruction prompts tried per wanted candidate, at most

Generate = Callable[[list[str]], list[str]]
T = TypeVar("T")


@dataclass
class SynthesisReport:
    """What happened, for the tenant's summary (counts only: no text leaves the tenant)."""

    instruction_prompts: int = 0
    rejected_format: int = 0
    rejected_similar_instruction: int = 0
    rejected_unparsed: int = 0
    rejected_similar_example: int = 0
    candidates: list[Example] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {
            "instruction_prompts": self.instruction_prompts,
            "rejected_format": self.rejected_format,
            "rejected_similar_instruction": self.rejected_similar_instruction,
            "rejected_unparsed": self.rejected_unparsed,
            "rejected_similar_example": self.rejected_similar_example,
            "candidates": len(self.candidates),
        }


class Greedy:
    """Batched greedy generation with ``model``; knows whether a prompt fits its context."""

    def __init__(self, model: Any, tokenizer: Any, config: FewFedPITConfig) -> None:
        self.model, self.tokenizer, self.config = model, tokenizer, config
        positions = getattr(model.config, "max_position_embeddings", None)
        self.max_prompt_tokens: int | None = None if positions is None else positions - config.max_new_tokens

    def __call__(self, batch: list[str]) -> list[str]:
        return generate_greedy(
            self.model,
            self.tokenizer,
            batch,
            self.config.max_new_tokens,
            batch_size=self.config.generation_batch_size,
        )

    def fits(self, prompt: str) -> bool:
        """Whether ``prompt`` plus ``max_new_tokens`` fits the model's positions."""
        if self.max_prompt_tokens is None:
            return True
        return len(self.tokenizer(prompt)["input_ids"]) <= self.max_prompt_tokens


def greedy(model: Any, tokenizer: Any, config: FewFedPITConfig) -> Greedy:
    """Batched greedy generation with ``model`` (prompts tokenised as in training)."""
    return Greedy(model, tokenizer, config)


def fitting_prompt(
    prompt_for: Callable[[list[T]], str], demos: list[T], generate: Generate
) -> str:
    """The prompt with as many of ``demos`` as fit the generator's context, dropping the first
    ones (a generator without ``fits`` takes every prompt)."""
    fits = getattr(generate, "fits", None)
    while fits is not None and len(demos) > 1 and not fits(prompt_for(demos)):
        demos = demos[1:]
    return prompt_for(demos)


def synthesize(
    local: Sequence[Example],
    generate: Generate,
    config: FewFedPITConfig,
    rng: random.Random,
    progress: Callable[[int], None] | None = None,
) -> SynthesisReport:
    """Up to ``config.candidates`` filtered synthetic examples from ``local`` demonstrations."""
    report = SynthesisReport()
    instructions = new_instructions(local, generate, config, rng, report, progress)
    report.candidates = examples_for(instructions, local, generate, config, rng, report)
    return report


def new_instructions(
    local: Sequence[Example],
    generate: Generate,
    config: FewFedPITConfig,
    rng: random.Random,
    report: SynthesisReport,
    progress: Callable[[int], None] | None = None,
) -> list[str]:
    """Step 1: filtered new instructions (at most ``config.candidates``)."""
    known = [e.instruction for e in local]
    accepted: list[str] = []
    budget = ATTEMPTS_PER_CANDIDATE * config.candidates
    demos = min(config.instruction_demos, len(local))
    while len(accepted) < config.candidates and report.instruction_prompts < budget:
        size = min(config.generation_batch_size, budget - report.instruction_prompts)
        batch = [
            fitting_prompt(
                prompts.instruction_prompt,
                [e.instruction for e in rng.sample(list(local), demos)],
                generate,
            )
            for _ in range(size)
        ]
        report.instruction_prompts += size
        for text in generate(batch):
            instruction = prompts.parse_instruction(text)
            if not filters.format_ok(instruction, config.min_instruction_words):
                report.rejected_format += 1
            elif filters.too_similar(instruction, known + accepted, config.similarity_threshold):
                report.rejected_similar_instruction += 1
            elif len(accepted) < config.candidates:
                accepted.append(instruction)
        if progress is not None:
            progress(size)
    return accepted


def examples_for(
    instructions: Sequence[str],
    local: Sequence[Example],
    generate: Generate,
    config: FewFedPITConfig,
    rng: random.Random,
    report: SynthesisReport,
) -> list[Example]:
    """Step 2: an input and a response per instruction, retried with new demonstrations."""
    local_texts = [filters.example_text(e) for e in local]
    done: dict[int, Example] = {}
    pending = list(range(len(instructions)))
    for _attempt in range(config.retries + 1):
        if not pending:
            break
        batch = []
        for index in pending:
            pool = rng.sample(list(local), len(local))
            demos = prompts.alternate_by_input(pool, config.response_demos)
            instruction = instructions[index]
            batch.append(
                fitting_prompt(lambda d: prompts.example_prompt(d, instruction), demos, generate)  # noqa: B023
            )
        still = []
        for index, text in zip(pending, generate(batch), strict=True):
            example = prompts.parse_example(instructions[index], text)
            if example is None:
                report.rejected_unparsed += 1
                still.append(index)
            elif filters.too_similar(
                filters.example_text(example), local_texts, config.similarity_threshold
            ):
                report.rejected_similar_example += 1
                still.append(index)
            else:
                done[index] = example
        pending = still
    return [done[i] for i in sorted(done)]
