"""HTTP requests with retries, by urllib3's ``Retry`` (the policy ``requests`` and boto use).

Two callers: a tenant pod's transfers by pre-signed URL (``engines/tenant/pod_io.py``) and
FedPT's large-model endpoint (``algorithms/fedpt/http_source.py``). Both retry connection
errors, timeouts and the listed statuses with exponential backoff (urllib3: no wait before
the first retry, then ``backoff_s * 2**(n-1)``; a ``Retry-After`` header is honoured), and
log one line per retry with a label the caller chooses, never the URL: a pre-signed URL's
query string is a credential. urllib3's own log lines name the request path, so a filter
cuts every query string out of them.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import urllib3
from urllib3.connectionpool import ConnectionPool
from urllib3.exceptions import MaxRetryError
from urllib3.response import BaseHTTPResponse
from urllib3.util.retry import Retry

log = logging.getLogger(__name__)


class _NoQueryStrings(logging.Filter):
    """Cut ``?...`` from every string argument of urllib3's log records."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                without_query(a) if isinstance(a, str) else a for a in record.args
            )
        return True


def without_query(text: str) -> str:
    """``text`` with everything from its first ``?`` replaced: a pre-signed URL's query string
    is a credential, and error texts and log lines may quote the URL."""
    return text.split("?", 1)[0] + "?<redacted>" if "?" in text else text


for _name in ("urllib3.connectionpool", "urllib3.util.retry"):
    logging.getLogger(_name).addFilter(_NoQueryStrings())


class _LabelledRetry(Retry):
    """urllib3's Retry that logs each retry under a label instead of the URL."""

    label = ""
    budget = 0  # retries in all, for the log line

    def new(self, **kw: Any) -> _LabelledRetry:
        again = super().new(**kw)  # Retry.new builds type(self): a _LabelledRetry
        again.label, again.budget = self.label, self.budget
        return again

    def increment(
        self,
        method: str | None = None,
        url: str | None = None,
        response: BaseHTTPResponse | None = None,
        error: Exception | None = None,
        _pool: ConnectionPool | None = None,
        _stacktrace: TracebackType | None = None,
    ) -> _LabelledRetry:
        # raises MaxRetryError when the budget is spent
        after = super().increment(method, url, response, error, _pool, _stacktrace)
        last = after.history[-1]
        reason = f"HTTP {last.status}" if last.status else str(last.error or "no answer")
        log.warning(
            "%s failed (%s); retry %d of %d", self.label, reason, len(after.history), self.budget
        )
        return after


@dataclass(frozen=True)
class Answer:
    """The final response: its status, body and how many requests it took."""

    status: int
    body: bytes
    requests: int


class RetryingClient:
    """Send requests with ``attempts`` tries in all (``attempts - 1`` retries)."""

    def __init__(
        self,
        *,
        attempts: int,
        backoff_s: float,
        connect_timeout_s: float,
        read_timeout_s: float,
        retry_statuses: Collection[int],
    ) -> None:
        self._attempts = attempts
        self._retry: dict[str, Any] = dict(
            total=attempts - 1,
            backoff_factor=backoff_s,
            status_forcelist=frozenset(retry_statuses),
            allowed_methods=None,  # every caller's request is idempotent (PUT of one object, scoring)
            raise_on_status=False,  # the caller reads the last answer and words the error
            redirect=0,
        )
        timeout = urllib3.Timeout(connect=connect_timeout_s, read=read_timeout_s)
        self._pool = urllib3.PoolManager(timeout=timeout)

    def send(
        self,
        method: str,
        url: str,
        *,
        label: str,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        """The final answer (any status) after retries.

        Raises:
            MaxRetryError: No answer at all after every attempt (``.reason`` says why).
        """
        retry = _LabelledRetry(**self._retry)
        retry.label, retry.budget = label, self._attempts - 1
        response = self._pool.request(
            method, url, body=body, headers=dict(headers or {}), retries=retry, preload_content=True
        )
        history = response.retries.history if response.retries is not None else ()
        return Answer(status=response.status, body=response.data, requests=len(history) + 1)


__all__ = ["Answer", "MaxRetryError", "RetryingClient", "without_query"]
