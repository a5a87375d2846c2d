"""Offline tokenizers for the data tests: byte-level BPE trained on a few strings."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from fedtune.data.templates import ALPACA_PROMPT_INPUT, ALPACA_PROMPT_NO_INPUT

_CORPUS = [
    ALPACA_PROMPT_INPUT,
    ALPACA_PROMPT_NO_INPUT,
    "Reverse the letters of the word. The answer is 42. apples banana cherry",
    "How many times does the letter a appear in the word banana? 3",
]


def _train(add_bos: bool) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(_CORPUS, trainer=trainer)
    if add_bos:
        backend.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", backend.token_to_id("<s>"))]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    """A GPT-2-like tokenizer: adds no special tokens by itself."""
    return _train(add_bos=False)


@pytest.fixture(scope="session")
def bos_tokenizer() -> PreTrainedTokenizerFast:
    """A Llama-like tokenizer: prepends <s> when asked for special tokens."""
    return _train(add_bos=True)
