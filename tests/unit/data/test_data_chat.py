"""Chat records: rendered with the tokenizer's chat template, loss on assistant turns only."""

from __future__ import annotations

import copy
import logging

import pytest
from transformers import PreTrainedTokenizerFast

from fedtune.core.errors import DataError
from fedtune.data.chat import DEFAULT_CHAT_TEMPLATE
from fedtune.data.formats import to_example
from fedtune.data.templates import render_prompt, training_prompt
from fedtune.data.tokenize import IGNORE_INDEX, encode_example, encode_examples
from fedtune.models.tokenizer import load_tokenizer

# Qwen2.5's template, shortened (ChatML): what a hub model's tokenizer_config.json carries.
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CONVERSATIONS = [
    [("user", "Hi?"), ("assistant", "Hello.")],
    [("system", "Be brief."), ("user", "2+3?"), ("assistant", "5"), ("user", "and 2*3?"),
     ("assistant", "6")],
    [("user", "Reverse cat."), ("assistant", "tac"), ("user", "thanks")],  # a trailing user turn
]


def _example(turns: list[tuple[str, str]]):  # type: ignore[no-untyped-def]
    return to_example({"messages": [{"role": r, "content": c} for r, c in turns]})


@pytest.fixture(scope="module")
def chatml(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = CHATML
    return tok


def _trained_and_masked(encoded: dict[str, list[int]], tok: PreTrainedTokenizerFast) -> tuple[str, str]:
    pairs = list(zip(encoded["input_ids"], encoded["labels"], strict=True))
    trained = [i for i, label in pairs if label != IGNORE_INDEX]
    assert trained == [label for _, label in pairs if label != IGNORE_INDEX]  # labels = ids there
    masked = [i for i, label in pairs if label == IGNORE_INDEX]
    return tok.decode(trained), tok.decode(masked)


@pytest.mark.parametrize("turns", CONVERSATIONS)
def test_chat_template_loss_falls_on_assistant_turns_only(
    turns: list[tuple[str, str]], chatml: PreTrainedTokenizerFast
) -> None:
    encoded = encode_example(_example(turns), chatml, max_len=512)
    trained, masked = _trained_and_masked(encoded, chatml)
    answers = [c for r, c in turns if r == "assistant"]
    assert trained == "".join(f"{a}<|im_end|>\n" for a in answers)
    for role, content in turns[: max(i for i, (r, _) in enumerate(turns) if r == "assistant")]:
        if role != "assistant":
            assert f"<|im_start|>{role}\n{content}<|im_end|>" in masked
    assert "thanks" not in chatml.decode(encoded["input_ids"])  # after the last answer: dropped


@pytest.mark.parametrize("turns", CONVERSATIONS)
def test_default_template_for_a_tokenizer_without_one(
    turns: list[tuple[str, str]], tokenizer: PreTrainedTokenizerFast
) -> None:
    assert tokenizer.chat_template is None
    encoded = encode_example(_example(turns), tokenizer, max_len=512)
    trained, masked = _trained_and_masked(encoded, tokenizer)
    answers = [c for r, c in turns if r == "assistant"]
    assert trained == "".join(f"{a}</s>\n\n" for a in answers)
    assert masked.startswith(f"### {turns[0][0].capitalize()}:\n{turns[0][1]}")
    assert masked.endswith("### Assistant:\n")


def test_builtin_tokenizer_uses_the_default_template() -> None:
    builtin = load_tokenizer("builtin")
    assert builtin.chat_template is None  # what the default template is for
    encoded = encode_example(_example(CONVERSATIONS[0]), builtin, max_len=256)
    trained, _ = _trained_and_masked(encoded, builtin)
    assert trained.startswith("Hello.") and DEFAULT_CHAT_TEMPLATE.count("eos_token") == 1


def test_truncation_keeps_the_start_and_skips_chats_with_no_answer_left(
    chatml: PreTrainedTokenizerFast, caplog: pytest.LogCaptureFixture
) -> None:
    example = _example(CONVERSATIONS[1])
    full = encode_example(example, chatml, max_len=512)
    first_label = next(i for i, label in enumerate(full["labels"]) if label != IGNORE_INDEX)
    cut = encode_example(example, chatml, max_len=first_label + 1)
    assert cut["input_ids"] == full["input_ids"][: first_label + 1]
    with pytest.raises(DataError, match="no assistant token within max_len"):
        encode_example(example, chatml, max_len=first_label)
    with caplog.at_level(logging.WARNING):
        kept = encode_examples([example, _example(CONVERSATIONS[0])], chatml, max_len=first_label)
    assert len(kept) == 1 and "skipped 1 example" in caplog.text


def test_a_template_that_rewrites_earlier_turns_is_refused(chatml: PreTrainedTokenizerFast) -> None:
    tok = copy.deepcopy(chatml)
    # Like templates that drop earlier reasoning: only the last assistant turn is kept whole.
    tok.chat_template = CHATML.replace(
        "{{ message['content'] }}",
        "{% if message['role'] == 'assistant' and not loop.last %}...{% else %}"
        "{{ message['content'] }}{% endif %}",
    )
    with pytest.raises(DataError, match="renders the turns before turn 4 differently once turn 4 follows") as raised:
        encode_examples([_example(CONVERSATIONS[1])], tok, max_len=512)  # not skipped: raised
    assert "one record per assistant turn" in raised.value.fix


def test_a_template_that_fails_is_a_clear_error(chatml: PreTrainedTokenizerFast) -> None:
    tok = copy.deepcopy(chatml)
    tok.chat_template = "{{ raise_exception('Conversation roles must alternate') }}"
    with pytest.raises(DataError, match="Conversation roles must alternate"):
        encode_examples([_example(CONVERSATIONS[0])], tok, max_len=512)


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ("hi", "'messages' must be a non-empty list, got str: 'hi'"),
        ([], "'messages' must be a non-empty list, got list"),
        (["hi"], r"messages\[0\] must be an object with role and content, got 'hi'"),
        ([{"role": "user", "content": 3}], r"messages\[0\].content must be a string, got int: '3'"),
        ([{"role": "bot", "content": "x"}], r"messages\[0\].role is 'bot', not one of system, user"),
        ([{"role": "user", "content": "x"}], "no assistant turn to learn from"),
    ],
)
def test_malformed_chat_records_say_what_and_where(messages: object, expected: str) -> None:
    with pytest.raises(DataError, match=expected) as raised:
        to_example({"messages": messages}, source="chat.jsonl", line=7)
    assert str(raised.value).startswith("chat.jsonl, line 7: ") and raised.value.record == 7
    assert '"role"' in raised.value.fix


def test_the_audit_prompts_a_chat_as_it_was_trained(chatml: PreTrainedTokenizerFast) -> None:
    turns = CONVERSATIONS[1]
    whole = chatml.apply_chat_template(
        [{"role": r, "content": c} for r, c in turns], chat_template=CHATML, tokenize=False
    )
    assert training_prompt(_example(turns), chatml) + "6<|im_end|>\n" == whole
    plain = to_example({"instruction": "Say hi.", "output": "Hi"})
    assert training_prompt(plain, chatml) == render_prompt(plain)
