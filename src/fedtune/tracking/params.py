"""Turning configs into loggable parameters without leaking secrets.

Pure helpers shared by every tracker: nested mappings become dotted keys (``a.b.c``), values
become strings capped at the backend's length limit, and anything whose key looks like a
credential is dropped before it can reach a tracking server, an artifact or a log line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# Whole words of a key that mark a credential. Matching words rather than substrings keeps
# ordinary parameters such as ``max_new_tokens`` or ``tokenizer`` (the words "tokens",
# "tokenizer") while catching ``hf_token``, ``aws_secret_access_key`` or ``apiKey``.
_SECRET_WORDS = frozenset(
    {
        "key",
        "apikey",
        "accesskey",
        "secretkey",
        "secret",
        "secrets",
        "password",
        "passwd",
        "pwd",
        "token",
        "credential",
        "credentials",
        "passphrase",
    }
)
_WORD_SPLIT = re.compile(r"[^a-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")

DEFAULT_MAX_VALUE_LENGTH = 6000
"""MLflow 3's limit on a parameter value (``MAX_PARAM_VAL_LENGTH``)."""


def is_secret_key(key: str) -> bool:
    """Whether a (possibly dotted, snake_case or camelCase) key names a credential."""
    words = _WORD_SPLIT.split(_CAMEL.sub("_", key).lower())
    return any(word in _SECRET_WORDS for word in words)


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings to one level with dotted keys; lists and scalars are leaves."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten(value, full))
        else:
            flat[full] = value
    return flat


def loggable_params(
    params: Mapping[str, Any], max_value_length: int = DEFAULT_MAX_VALUE_LENGTH
) -> dict[str, str]:
    """Flattened, stringified, truncated parameters with secret-looking keys removed.

    Args:
        params: Possibly nested parameters (e.g. a job config dumped to a dict).
        max_value_length: Longer values are cut to this many characters (ending in ``...``).

    Returns:
        ``{"a.b.c": "value"}`` for every non-secret leaf.
    """
    out: dict[str, str] = {}
    for key, value in flatten(params).items():
        if is_secret_key(key):
            continue
        text = "None" if value is None else str(value)
        if len(text) > max_value_length:
            text = text[: max_value_length - 3] + "..."
        out[key] = text
    return out


def redact(obj: Any) -> Any:
    """A copy of a JSON-like object without the entries whose key looks like a secret."""
    if isinstance(obj, Mapping):
        return {k: redact(v) for k, v in obj.items() if not is_secret_key(str(k))}
    if isinstance(obj, list | tuple):
        return [redact(v) for v in obj]
    return obj
