"""Prompt templates: Alpaca-style training prompts and the GSM8K 8-shot evaluation prompt.

The training templates are the Stanford Alpaca ones used by FedBiOT (Appendix D), FedPT,
FedMKT and FewFedPIT: the Input block appears only when the example has a non-empty input,
and the no-input variant has its own shorter preamble. The loss is taken only on the response
that follows the prompt (see :mod:`fedtune.data.tokenize`).

The GSM8K exemplars are the eight chain-of-thought demonstrations printed in FedBiOT's
Appendix D.2 (originally Wei et al., 2022), in the paper's order. Two choices the paper's
text leaves open, made explicit here:

- the math in the printed exemplars is typeset (``$21 - 15 = 6$``); the plain text is used;
- the exemplar blocks use the same ``### Instruction:`` / ``### Response:`` markers as the
  training template, so a model fine-tuned on Alpaca-style prompts sees the layout it learnt.
"""

from __future__ import annotations

from typing import Any, Final

from fedtune.core.errors import ConfigError
from fedtune.data.formats import Example

__all__ = [
    "ALPACA_PROMPT_INPUT",
    "ALPACA_PROMPT_NO_INPUT",
    "GSM8K_EXEMPLARS",
    "GSM8K_FEW_SHOT_PREAMBLE",
    "gsm8k_few_shot_prompt",
    "render_prompt",
    "training_prompt",
]

ALPACA_PROMPT_INPUT: Final[str] = (
    "Below is an instruction that describes a task, paired with an input that provides "
    "further context. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_PROMPT_NO_INPUT: Final[str] = (
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)

GSM8K_FEW_SHOT_PREAMBLE: Final[str] = (
    "Below is a set of demos followed by an instruction that describes a task. "
    "Write a response that appropriately completes the request."
)

# (question, chain-of-thought response) pairs, FedBiOT Appendix D.2, in the paper's order.
GSM8K_EXEMPLARS: Final[tuple[tuple[str, str], ...]] = (
    (
        "There are 15 trees in the grove. Grove workers will plant trees in the grove today. "
        "After they are done, there will be 21 trees. How many trees did the grove workers "
        "plant today?",
        "There are 15 trees originally. Then there were 21 trees after some more were "
        "planted. So there must have been 21 - 15 = 6. The answer is 6.",
    ),
    (
        "If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are in "
        "the parking lot?",
        "There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5. The answer is 5.",
    ),
    (
        "Leah had 32 chocolates and her sister had 42. If they ate 35, how many pieces do "
        "they have left in total?",
        "Originally, Leah had 32 chocolates. Her sister had 42. So in total they had "
        "32 + 42 = 74. After eating 35, they had 74 - 35 = 39. The answer is 39.",
    ),
    (
        "Jason had 20 lollipops. He gave Denny some lollipops. Now Jason has 12 lollipops. "
        "How many lollipops did Jason give to Denny?",
        "Jason started with 20 lollipops. Then he had 12 after giving some to Denny. So he "
        "gave Denny 20 - 12 = 8. The answer is 8.",
    ),
    (
        "Shawn has five toys. For Christmas, he got two toys each from his mom and dad. How "
        "many toys does he have now?",
        "Shawn started with 5 toys. If he got 2 toys each from his mom and dad, then that is "
        "4 more toys. 5 + 4 = 9. The answer is 9.",
    ),
    (
        "There were nine computers in the server room. Five more computers were installed "
        "each day, from monday to thursday. How many computers are now in the server room?",
        "There were originally 9 computers. For each of 4 days, 5 more computers were added. "
        "So 5 * 4 = 20 computers were added. 9 + 20 is 29. The answer is 29.",
    ),
    (
        "Michael had 58 golf balls. On tuesday, he lost 23 golf balls. On wednesday, he lost "
        "2 more. How many golf balls did he have at the end of wednesday?",
        "Michael started with 58 golf balls. After losing 23 on tuesday, he had "
        "58 - 23 = 35. After losing 2 more, he had 35 - 2 = 33 golf balls. The answer is 33.",
    ),
    (
        "Olivia has $23. She bought five bagels for $3 each. How much money does she have left?",
        "Olivia had 23 dollars. 5 bagels for 3 dollars each will be 5 * 3 = 15 dollars. So "
        "she has 23 - 15 dollars left. 23 - 15 is 8. The answer is 8.",
    ),
)

_SHOT: Final[str] = "### Instruction:\n{question}\n\n### Response:\n{response}\n\n"
_QUERY: Final[str] = "### Instruction:\n{question}\n\n### Response:\n"


def render_prompt(example: Example) -> str:
    """The Alpaca prompt for an example, ending right before the response.

    A whitespace-only input counts as empty, so it never produces an empty Input block.
    """
    if example.input.strip():
        return ALPACA_PROMPT_INPUT.format(instruction=example.instruction, input=example.input)
    return ALPACA_PROMPT_NO_INPUT.format(instruction=example.instruction)


def gsm8k_few_shot_prompt(question: str, shots: int = 8) -> str:
    """The FedBiOT GSM8K evaluation prompt: preamble, ``shots`` exemplars, then the question.

    Args:
        question: The GSM8K test question.
        shots: How many of the eight exemplars to include, in the paper's order (0-8).

    Raises:
        ConfigError: If ``shots`` is outside 0..8.
    """
    if not 0 <= shots <= len(GSM8K_EXEMPLARS):
        raise ConfigError(
            f"gsm8k shots={shots} is out of range",
            fix=f"Use between 0 and {len(GSM8K_EXEMPLARS)} shots (the paper uses 8).",
        )
    demos = "".join(_SHOT.format(question=q, response=r) for q, r in GSM8K_EXEMPLARS[:shots])
    return f"{GSM8K_FEW_SHOT_PREAMBLE}\n\n{demos}{_QUERY.format(question=question)}"


def training_prompt(example: Example, tokenizer: Any) -> str:
    """The text the model read before its (last) answer in training: a chat rendered up to
    its last assistant turn with the generation prompt, else :func:`render_prompt`."""
    if not example.messages:
        return render_prompt(example)
    from fedtune.data.chat import render_chat

    last = max(i for i, (role, _) in enumerate(example.messages) if role == "assistant")
    return render_chat(tokenizer, example.messages[:last], True)
