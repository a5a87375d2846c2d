"""Shared pydantic base and field types for every config section."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

# Kubernetes DNS-1123 label: tenant names double as namespace names, pod-name parts and
# store prefixes, so the strictest common rule applies to all of them.
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class StrictModel(BaseModel):
    """Frozen, unknown keys rejected, validated on assignment: every config section uses it."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


def check_dns1123_label(value: str) -> str:
    """Reject anything Kubernetes would not accept as a namespace / object name."""
    if len(value) > 63 or not _DNS1123_LABEL.match(value):
        raise ValueError(
            f"{value!r} is not a DNS-1123 label; use at most 63 lowercase letters, digits "
            "and '-', starting and ending with a letter or digit (e.g. 'tenant-a')"
        )
    return value


Dns1123Label = Annotated[str, AfterValidator(check_dns1123_label)]
