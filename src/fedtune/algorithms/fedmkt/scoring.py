"""One model's scores on held-out examples, as FedMKT's paper reports them (paper 003, Sec. 4.1):
multiple-choice accuracy on classification tasks (RTE, WiC, BoolQ, CQA, ARC) and Rouge-L on
generation tasks (S-NI, DialogSum).

Which examples are multiple choice is read off the data: a category whose responses (over the
examples the scorer knows, ``labels_from``) take between 2 and ``max_options`` distinct values
is a label set, and each of its examples is scored by option log-likelihood over that set
(:func:`fedtune.eval.choice.mc_accuracy`, the harness's ``acc``). Every other example is
scored by Rouge-L of its greedy answer (:mod:`fedtune.eval.rouge`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from fedtune.core.errors import ConfigError
from fedtune.data.formats import Example
from fedtune.data.templates import render_prompt
from fedtune.eval.choice import ChoiceItem, mc_accuracy
from fedtune.eval.generation import generate_greedy
from fedtune.eval.rouge import rouge_l_corpus


def label_sets(examples: Sequence[Example], max_options: int) -> dict[str, tuple[str, ...]]:
    """Per category (``""`` for none), its sorted responses where they form a label set."""
    seen: dict[str, set[str]] = defaultdict(set)
    for e in examples:
        seen[e.category or ""].add(e.response.strip())
    return {c: tuple(sorted(v)) for c, v in seen.items() if 2 <= len(v) <= max_options}


def score_model(
    model: Any,
    tokenizer: Any,
    examples: Sequence[Example],
    *,
    labels_from: Sequence[Example],
    max_options: int,
    max_new_tokens: int,
    batch_size: int = 8,
) -> dict[str, float]:
    """``acc`` (multiple-choice examples) and ``rouge_l`` (the others) of ``model``, each only
    where such examples exist, with their counts ``n_choice`` and ``n_generate``.

    Raises:
        ConfigError: ``examples`` is empty.
    """
    if not examples:
        raise ConfigError(
            "FedMKT evaluation got no held-out examples to score",
            fix="Give the tenant a held-out split (training.eval_fraction > 0) and the provider "
            "held-out public rows (algorithm.llm_eval_size > 0), or score nothing.",
        )
    labels = label_sets(labels_from, max_options)
    choice: list[ChoiceItem] = []
    generate: list[Example] = []
    for e in examples:
        options = labels.get(e.category or "")
        if options and e.response.strip() in options:
            # No leading space: the prompt ends in a newline and training appended the
            # response to it as is (fedtune.data.tokenize).
            choice.append(ChoiceItem(render_prompt(e), options, options.index(e.response.strip())))
        else:
            generate.append(e)
    out: dict[str, float] = {"n_choice": float(len(choice)), "n_generate": float(len(generate))}
    if choice:
        out["acc"] = mc_accuracy(model, tokenizer, choice)
    if generate:
        predictions = generate_greedy(
            model, tokenizer, [render_prompt(e) for e in generate], max_new_tokens, batch_size=batch_size
        )
        out["rouge_l"] = rouge_l_corpus(predictions, [e.response for e in generate])
    return out
