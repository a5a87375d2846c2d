"""FewFedPIT's filters on generated data (paper 004, Section 3.3).

- Format: drop instructions that start like a refusal or a persona ("As a ...", "Sorry ...",
  footnote 1), that are too short, or that hold no letter.
- Diversity: drop a new instruction whose Rouge-L to any local instruction is above the
  threshold (0.7, after Self-Instruct), and a new example whose text is that close to a local
  example's. Rouge-L here is unstemmed, as Self-Instruct computes it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from fedtune.data.formats import Example
from fedtune.eval.rouge import rouge_l

BAD_STARTS = ("as a", "as an", "sorry", "i'm sorry", "i am sorry", "i cannot", "i can't")
MAX_INSTRUCTION_WORDS = 150
_LETTER = re.compile(r"[^\W\d_]")


def format_ok(instruction: str, min_words: int) -> bool:
    """Whether ``instruction`` passes the format filter."""
    text = instruction.strip()
    words = text.split()
    if not min_words <= len(words) <= MAX_INSTRUCTION_WORDS:
        return False
    if not _LETTER.search(text):
        return False
    return not text.lower().startswith(BAD_STARTS)


def too_similar(text: str, references: Iterable[str], threshold: float) -> bool:
    """Whether Rouge-L of ``text`` to any reference is above ``threshold``."""
    return any(rouge_l(text, ref, stem=False) > threshold for ref in references)


def example_text(example: Example) -> str:
    """What the example-level similarity filter compares."""
    return " ".join(part for part in (example.instruction, example.input, example.response) if part)
