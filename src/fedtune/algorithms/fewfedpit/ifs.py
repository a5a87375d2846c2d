"""The instruction-following score (paper 004, Section 3.3) that ranks synthetic candidates.

    IFS(x, y) = L(y | x) / L(y)

``L(y | x)`` is the mean token cross-entropy of the response given the training prompt of
the example, in the encoding training uses (:func:`~fedtune.data.tokenize.encode_example`:
BOS only where the tokenizer adds one by itself, Alpaca prompt, response, EOS), so it is the
example's training loss; ``L(y)`` is the same response given only that BOS or, for a
tokenizer that adds none (the builtin one, GPT-2's), given its own first token, which is
then not scored. Scored by the tenant's private model M^l. A low IFS means the instruction
makes the response much more likely: FewFedPIT keeps the lowest.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from fedtune.data.formats import Example
from fedtune.data.templates import render_prompt
from fedtune.data.tokenize import bos_prefix
from fedtune.eval._model_utils import model_device
from fedtune.training.precision import model_autocast

__all__ = ["instruction_following_score", "response_loss"]


@torch.no_grad()
def response_loss(model: torch.nn.Module, tokenizer: Any, prompt: str | None, response: str) -> float:
    """Mean cross-entropy of ``response`` + EOS after ``prompt`` (None: none), both encoded
    as training encodes them (BOS only where the tokenizer adds one)."""
    context = bos_prefix(tokenizer) + (tokenizer(prompt, add_special_tokens=False)["input_ids"] if prompt else [])
    target = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    if not context:  # a tokenizer without BOS: the first response token has no context
        context, target = target[:1], target[1:]
    device = model_device(model)
    ids = torch.tensor([context + target], device=device)
    with model_autocast(model):
        logits = model(input_ids=ids).logits[0, len(context) - 1 : -1].float()
    return float(F.cross_entropy(logits, torch.tensor(target, device=device)))


def instruction_following_score(
    model: torch.nn.Module, tokenizer: Any, instruction: str, response: str, input: str = ""
) -> float:
    """``L(y | x) / L(y)`` for one example (x: the Alpaca prompt of instruction and input)."""
    prompt = render_prompt(Example(instruction=instruction, input=input, response=response))
    return response_loss(model, tokenizer, prompt, response) / response_loss(
        model, tokenizer, None, response
    )
