"""Self-instruct demonstrations for the pretraining corpus: records that teach a
base model the two continuations FewFedPIT's generator asks of it.

FewFedPIT (paper 004, Section 3.3, after Self-Instruct) prompts the global model with raw text,
not the Alpaca training template (:mod:`fedtune.algorithms.fewfedpit.prompts`):

- *instruction* prompts: a header, ``Task 1: ...`` to ``Task N: ...`` (local instructions),
  then ``Task N+1:``; the model should write one new task on one line;
- *example* prompts: a header, ``Instruction / Input / Output`` blocks, then a new
  ``Instruction:`` and ``Input:``; the model should write the input (or ``<noinput>``) and
  ``Output: <the correct answer>``.

A demonstration is built with those very prompt functions, so its prompt is token for token
what the generator will read. Its shown tasks come from the pretraining corpus itself (the
public mixture: never a test or validation record), a few of one kind (a third of them of
mixed kinds, as a tenant's local data can be), and its continuation is a task of the same
kind written in *another* phrasing (:data:`PHRASINGS`): the suite's own templates differ
between records only in names and numbers, so a new task in a suite template is always above
FewFedPIT's Rouge-L cut-off (0.7) to some local task and is filtered out; a rephrased one is
not. Example demonstrations answer such rephrased tasks correctly. Counting never appears:
the public mixture leaves it to the tenants on purpose (:mod:`fedtune.benchmarks.suite`).

The records are Dolly-shaped (``instruction`` = the raw prompt, ``response`` = the
continuation) with category :data:`SELF_INSTRUCT`; pretraining encodes them raw
(:func:`encode_raw`): the prompt tokenised as ``generate_greedy`` tokenises it, the loss on
the continuation and its EOS only.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from fedtune.algorithms.fewfedpit.prompts import (
    NO_INPUT,
    alternate_by_input,
    example_prompt,
    instruction_prompt,
)
from fedtune.data.formats import Example
from fedtune.data.synthetic import LEXICON
from fedtune.data.tokenize import IGNORE_INDEX, Encoded

__all__ = ["PHRASINGS", "SELF_INSTRUCT", "demonstrations", "encode_raw", "is_raw"]

#: The category of a demonstration record (encoded raw, without the training template).
SELF_INSTRUCT: Final = "self-instruct"
# FewFedPIT's defaults: 8 instruction demonstrations, 4 example demonstrations; fewer are
# drawn too, as the generator drops the first ones when a prompt would not fit the context.
_MAX_TASKS: Final = 8
_MAX_EXAMPLES: Final = 4
_MIXED_SHARE: Final = 1 / 3
_EXAMPLE_SHARE: Final = 0.5  # the rest are instruction demonstrations
# Prompt lengths in characters (about 2.2 per token of the builtin tokenizer): the generator
# drops the first demonstrations until a prompt fits the context (256 positions less the new
# tokens), so most of its prompts are near 220 tokens; shorter ones fit max_seq_len 160.
_PROMPT_CHARS: Final = (320, 480)

_Task = tuple[str, str, str]  # instruction, input, response
_NAMES: Final = ("Mia", "Leo", "Nora", "Omar", "Pia", "Raj", "Sara", "Tom", "Uma", "Vik")
_THINGS: Final = ("eggs", "cups", "bottles", "shirts", "plates", "tickets", "boxes", "keys")
_LETTERS: Final = "abcdefghijklmnopqrstuvwxyz"


def _word(rng: random.Random, low: int, high: int) -> str:
    return "".join(rng.choice(_LETTERS) for _ in range(rng.randint(low, high)))


def _sum(rng: random.Random) -> _Task:
    a, b = rng.randint(2, 50), rng.randint(1, 50)
    answer = f"{a} + {b} = {a + b}. The answer is {a + b}."
    name, things = rng.choice(_NAMES), rng.choice(_THINGS)
    return rng.choice(
        (
            (f"Add {a} and {b}.", "", answer),
            (f"Compute the sum of {a} and {b}.", "", answer),
            (f"{name} bought {a} {things} on Monday and {b} on Tuesday. What is the total?", "", answer),
            ("Add the two numbers below.", f"{a} and {b}", answer),
        )
    )


def _difference(rng: random.Random) -> _Task:
    a = rng.randint(10, 60)
    b = rng.randint(1, a - 1)
    answer = f"{a} - {b} = {a - b}. The answer is {a - b}."
    things = rng.choice(_THINGS)
    return rng.choice(
        (
            (f"Subtract {b} from {a}.", "", answer),
            (f"A box holds {a} {things}; {b} are taken out. How many remain in the box?", "", answer),
            ("Take the second number away from the first.", f"{a} and {b}", answer),
        )
    )


def _reverse(rng: random.Random) -> _Task:
    word = _word(rng, 3, 7)
    return rng.choice(
        (
            (f"Write the word '{word}' backwards.", "", word[::-1]),
            (f"Spell '{word}' from its last letter to its first.", "", word[::-1]),
            ("Write the given word backwards.", word, word[::-1]),
        )
    )


def _lookup(rng: random.Random) -> _Task:
    keys = rng.sample([a + b + c for a in "aeiou" for b in "bdklmrst" for c in "aeiou"], rng.randint(3, 5))
    values = [rng.randint(10, 99) for _ in keys]
    target = rng.randrange(len(keys))
    table = "\n".join(f"{key}: {value}" for key, value in zip(keys, values, strict=True))
    return rng.choice(
        (
            (f"Which number is paired with '{keys[target]}' in the list below?", table, str(values[target])),
            (f"Find the number stored under the key '{keys[target]}'.", table, str(values[target])),
            (f"Read off the entry for '{keys[target]}' from this list.", table, str(values[target])),
        )
    )


def _classify(rng: random.Random) -> _Task:
    label = rng.choice(sorted(LEXICON))
    word = rng.choice(LEXICON[label])
    return rng.choice(
        (
            (f"Name the category of '{word}': animal, fruit or color.", "", label),
            (f"Tell me whether '{word}' names an animal, a fruit or a color.", "", label),
            ("Sort the given word into animal, fruit or color.", word, label),
        )
    )


#: New-task phrasings per suite category (the suite's own templates are never reused).
PHRASINGS: Final[dict[str, tuple[Callable[[random.Random], _Task], ...]]] = {
    "arithmetic": (_sum, _difference),
    "reverse": (_reverse,),
    "lookup": (_lookup,),
    "classify": (_classify,),
}


def _new_task(category: str, rng: random.Random) -> Example:
    instruction, given, response = rng.choice(PHRASINGS[category])(rng)
    return Example(instruction=instruction, input=given, response=response, category=category)


def _shown(pools: Mapping[str, list[Example]], category: str, count: int, rng: random.Random) -> list[Example]:
    """``count`` corpus tasks: all of ``category``, or (a third of the time) of mixed kinds
    ending with one of ``category``."""
    if rng.random() < _MIXED_SHARE:
        kinds = [rng.choice(sorted(pools)) for _ in range(count - 1)] + [category]
        return [rng.choice(pools[kind]) for kind in kinds]
    return rng.sample(pools[category], min(count, len(pools[category])))


def _fitting(prompt_for: Callable[[list[Any]], str], demos: list[Any], budget: int) -> str:
    """As FewFedPIT's ``fitting_prompt``: drop the first demonstrations while too long."""
    while len(demos) > 1 and len(prompt_for(demos)) > budget:
        demos = demos[1:]
    return prompt_for(demos)


def demonstrations(corpus: Sequence[Mapping[str, Any]], count: int, seed: int) -> list[dict[str, str]]:
    """``count`` demonstration records drawn from ``corpus`` (Dolly records), deterministic in
    ``seed``: about half instruction demonstrations, half example demonstrations."""
    rng = random.Random(f"fedtune-self-instruct:{seed}")
    pools: dict[str, list[Example]] = {}
    for record in corpus:
        category = str(record.get("category", ""))
        if category in PHRASINGS:
            pools.setdefault(category, []).append(
                Example(str(record["instruction"]), str(record.get("context") or ""), str(record["response"]), category)
            )
    kinds = sorted(pools)
    if count and not kinds:
        raise ValueError("the corpus holds no record of a category with new-task phrasings")
    records = []
    for _ in range(count):
        category = rng.choice(kinds)
        new = _new_task(category, rng)
        budget = rng.choice(_PROMPT_CHARS)
        if rng.random() < _EXAMPLE_SHARE:
            shown = _shown(pools, category, 2 * _MAX_EXAMPLES, rng)
            demos = alternate_by_input(shown, rng.randint(1, _MAX_EXAMPLES))
            prompt = _fitting(lambda d: example_prompt(d, new.instruction), demos, budget)  # noqa: B023
            continuation = f" {new.input.strip() or NO_INPUT}\nOutput: {new.response}"
        else:
            shown = _shown(pools, category, rng.randint(2, _MAX_TASKS), rng)
            prompt = _fitting(instruction_prompt, [e.instruction for e in shown], budget)
            continuation = f" {new.instruction}"
        records.append({"instruction": prompt, "context": "", "response": continuation, "category": SELF_INSTRUCT})
    return records


def is_raw(record: Mapping[str, Any]) -> bool:
    """Whether ``record`` is a demonstration (encoded by :func:`encode_raw`)."""
    return record.get("category") == SELF_INSTRUCT


def encode_raw(record: Mapping[str, Any], tokenizer: Any, max_len: int) -> Encoded | None:
    """A demonstration's ids: the prompt as ``generate_greedy`` tokenises it (special tokens
    added), then the continuation and EOS, the loss on those only; None if the prompt leaves
    no room in ``max_len``."""
    prompt = list(tokenizer(str(record["instruction"]), add_special_tokens=True)["input_ids"])
    response = [*tokenizer(str(record["response"]), add_special_tokens=False)["input_ids"], int(tokenizer.eos_token_id)]
    if len(prompt) >= max_len:
        return None
    input_ids = (prompt + response)[:max_len]
    labels = ([IGNORE_INDEX] * len(prompt) + response)[:max_len]
    return {"input_ids": input_ids, "labels": labels, "attention_mask": [1] * len(input_ids)}
