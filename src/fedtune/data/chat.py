"""Chat records (``messages``: a list of ``{role, content}``) and their chat-template text.

A conversation is rendered with the tokenizer's own chat template (``tokenizer.chat_template``,
Hugging Face's Jinja convention). The loss is on the assistant turns only: the text is cut
into segments by rendering the conversation up to each assistant turn with the generation
prompt (what the model reads before it answers) and up to the end of that turn (what it
writes, including the template's end-of-turn marker); the difference is trained, the rest
masked. This needs a template that renders earlier turns the same whatever follows them;
one that does not (e.g. one that drops earlier reasoning) is refused with a clear error.

A tokenizer without a chat template (fedtune's builtin one) gets
:data:`DEFAULT_CHAT_TEMPLATE`, a plain-text template in the style of the Alpaca prompt::

    ### User:
    What is 2+3?

    ### Assistant:
    5<eos>

"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from fedtune.core.errors import DataError

__all__ = [
    "DEFAULT_CHAT_TEMPLATE",
    "ROLES",
    "Turn",
    "chat_segments",
    "parse_messages",
    "render_chat",
]

Turn = tuple[str, str]  # (role, content)

ROLES: Final = ("system", "user", "assistant")

# Newlines are written as expressions: transformers renders templates with trim_blocks, which
# drops a newline that follows a block tag.
DEFAULT_CHAT_TEMPLATE: Final = (
    "{% for message in messages %}"
    "{{ '### ' + message['role'] | capitalize + ':\\n' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '### Assistant:\\n' }}{% endif %}"
)
"""The chat template of a tokenizer that has none (fedtune's builtin tokenizer)."""

_FIX: Final = (
    'Write "messages" as a list of {"role": "system"|"user"|"assistant", "content": "..."} '
    "objects with at least one assistant turn."
)


def parse_messages(value: Any, where: str) -> tuple[Turn, ...]:
    """The turns of a record's ``messages``, checked.

    Raises:
        DataError: ``messages`` is not a list of ``{role, content}`` objects with string
            content and a known role, or holds no assistant turn (nothing to learn).
    """
    if not isinstance(value, list) or not value:
        raise DataError(
            f"{where}: 'messages' must be a non-empty list, got {type(value).__name__}: "
            f"{str(value)[:60]!r}",
            fix=_FIX,
        )
    turns: list[Turn] = []
    for index, message in enumerate(value):
        if not isinstance(message, dict):
            raise DataError(
                f"{where}: messages[{index}] must be an object with role and content, got "
                f"{str(message)[:60]!r}",
                fix=_FIX,
            )
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise DataError(
                f"{where}: messages[{index}].role is {role!r}, not one of {', '.join(ROLES)}",
                fix=_FIX,
            )
        if not isinstance(content, str):
            raise DataError(
                f"{where}: messages[{index}].content must be a string, got "
                f"{type(content).__name__}: {str(content)[:60]!r}",
                fix=_FIX,
            )
        turns.append((role, content))
    if not any(role == "assistant" for role, _ in turns):
        raise DataError(f"{where}: the conversation has no assistant turn to learn from", fix=_FIX)
    return tuple(turns)


def render_chat(tokenizer: Any, turns: Sequence[Turn], generation: bool) -> str:
    """``turns`` as the tokenizer's chat template (or the default) writes them, with the
    assistant's generation prompt at the end when ``generation``.

    Raises:
        DataError: The template fails on them.
    """
    template = getattr(tokenizer, "chat_template", None) or DEFAULT_CHAT_TEMPLATE
    messages = [{"role": role, "content": content} for role, content in turns]
    try:
        text = tokenizer.apply_chat_template(
            messages, chat_template=template, tokenize=False, add_generation_prompt=generation
        )
    except Exception as exc:  # noqa: BLE001 (Jinja raises its own TemplateError and more)
        raise DataError(
            f"the tokenizer's chat template fails on a conversation of {len(turns)} turn(s): "
            f"{type(exc).__name__}: {str(exc)[:200]}",
            fix="Check the record's turn order (many templates want system?, user, assistant, "
            "user, ...) or set a tokenizer whose template accepts it.",
        ) from exc
    return str(text)


def chat_segments(turns: Sequence[Turn], tokenizer: Any) -> list[tuple[str, bool]]:
    """The rendered conversation as ``(text, trained)`` pieces; assistant turns are trained.

    Turns after the last assistant turn teach nothing and are left out.

    Raises:
        DataError: The template fails, or renders earlier turns differently once later ones
            follow (then the loss could not be placed on the assistant's tokens).
    """
    segments: list[tuple[str, bool]] = []
    done = ""
    for index, (role, _) in enumerate(turns):
        if role != "assistant":
            continue
        prompt = render_chat(tokenizer, turns[:index], True)
        full = render_chat(tokenizer, turns[: index + 1], False)
        if not prompt.startswith(done) or not full.startswith(prompt):
            raise DataError(
                f"the chat template renders the turns before turn {index} differently once "
                f"turn {index} follows, so the assistant's tokens cannot be told apart",
                fix="Use a tokenizer whose chat template only appends turns (most do; some "
                "drop earlier reasoning), or split the conversation into one record per "
                "assistant turn.",
            )
        segments += [(prompt[len(done):], False), (full[len(prompt):], True)]
        done = full
    return [(text, trained) for text, trained in segments if text]

