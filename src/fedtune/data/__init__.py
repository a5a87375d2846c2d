"""Instruction data: record formats, prompt templates, partitioners, synthetic tasks.

Token-level encoding lives in :mod:`fedtune.data.tokenize` and is not imported here, so that
reading and partitioning data does not pull in torch and transformers.
"""

from fedtune.data.formats import Example, Format, detect_format, load_examples, to_example
from fedtune.data.jsonl import iter_jsonl, read_jsonl, write_jsonl
from fedtune.data.loader import read_examples, read_records
from fedtune.data.partition import (
    PARTITIONERS,
    CountTable,
    by_field,
    count_table,
    dirichlet,
    iid,
    partition,
    pathological,
    write_partitions,
)
from fedtune.data.synthetic import CATEGORIES, generate, generate_mixture, mixture_counts
from fedtune.data.templates import (
    ALPACA_PROMPT_INPUT,
    ALPACA_PROMPT_NO_INPUT,
    gsm8k_few_shot_prompt,
    render_prompt,
)

__all__ = [
    "ALPACA_PROMPT_INPUT",
    "ALPACA_PROMPT_NO_INPUT",
    "CATEGORIES",
    "PARTITIONERS",
    "CountTable",
    "Example",
    "Format",
    "by_field",
    "count_table",
    "detect_format",
    "dirichlet",
    "generate",
    "generate_mixture",
    "gsm8k_few_shot_prompt",
    "iid",
    "iter_jsonl",
    "load_examples",
    "mixture_counts",
    "partition",
    "pathological",
    "read_examples",
    "read_jsonl",
    "read_records",
    "render_prompt",
    "to_example",
    "write_jsonl",
    "write_partitions",
]
