"""Instruction data: record formats, prompt templates, partitioners, synthetic tasks.

Token-level encoding lives in :mod:`fedtune.data.tokenize` and is not imported here, so that
reading and partitioning data does not pull in torch and transformers.
Nothing is imported here until a name is used (PEP 562): the partitioners need numpy and rich,
which a pipeline step reading a tenant's records does not.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_HOME = {
    "Example": "formats",
    "Format": "formats",
    "detect_format": "formats",
    "load_examples": "formats",
    "to_example": "formats",
    "iter_jsonl": "jsonl",
    "read_jsonl": "jsonl",
    "write_jsonl": "jsonl",
    "read_examples": "loader",
    "read_records": "loader",
    "PARTITIONERS": "partition",
    "CountTable": "partition",
    "by_field": "partition",
    "count_table": "partition",
    "dirichlet": "partition",
    "iid": "partition",
    "partition": "partition",
    "pathological": "partition",
    "write_partitions": "partition",
    "CATEGORIES": "synthetic",
    "generate": "synthetic",
    "generate_mixture": "synthetic",
    "mixture_counts": "synthetic",
    "ALPACA_PROMPT_INPUT": "templates",
    "ALPACA_PROMPT_NO_INPUT": "templates",
    "gsm8k_few_shot_prompt": "templates",
    "render_prompt": "templates",
}

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


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
