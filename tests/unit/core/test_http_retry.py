"""Retries through urllib3's Retry: counts, statuses, and no query string in any log line."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from fedtune.config.job import LimitsConfig
from fedtune.core.errors import StoreError, StoreUnavailable
from fedtune.core.http_retry import MaxRetryError, RetryingClient
from fedtune.engines.tenant import pod_io

SECRET = "X-Amz-Signature=deadbeefcafe"


class _Flaky(HTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.fail_next: list[int] = []
        self.seen = 0


class _Handler(BaseHTTPRequestHandler):
    server: _Flaky

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self) -> None:
        self.server.seen += 1
        status = self.server.fail_next.pop(0) if self.server.fail_next else 200
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b"payload"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_POST = _answer


@pytest.fixture
def flaky() -> Iterator[_Flaky]:
    server = _Flaky()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _url(server: _Flaky) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/bucket/key?{SECRET}"


def _client(attempts: int = 3) -> RetryingClient:
    return RetryingClient(
        attempts=attempts, backoff_s=0.01, connect_timeout_s=2, read_timeout_s=2,
        retry_statuses=(503,),
    )


def test_listed_statuses_are_retried_and_counted_and_no_log_line_holds_the_query(
    flaky: _Flaky, caplog: pytest.LogCaptureFixture
) -> None:
    flaky.fail_next = [503, 503]
    caplog.set_level(logging.DEBUG)
    answer = _client().send("PUT", _url(flaky), label="PUT of update", body=b"abc")
    assert (answer.status, answer.body, answer.requests) == (200, b"abc", 3)
    assert "PUT of update failed (HTTP 503); retry 2 of 2" in caplog.text
    assert "deadbeef" not in caplog.text  # urllib3's own lines included


def test_an_unlisted_status_is_answered_at_once(flaky: _Flaky) -> None:
    flaky.fail_next = [404]
    answer = _client().send("GET", _url(flaky), label="GET")
    assert (answer.status, answer.requests, flaky.seen) == (404, 1, 1)


def test_no_answer_after_every_attempt_raises_with_the_reason() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(MaxRetryError):
        _client(2).send("GET", f"http://127.0.0.1:{port}/k?{SECRET}", label="GET")


def test_tenant_transfers_word_their_errors_without_the_url(flaky: _Flaky) -> None:
    limits = LimitsConfig(store_max_attempts=2)
    flaky.fail_next = [503, 503]
    with pytest.raises(StoreError, match="HTTP 503 Service Unavailable") as info:
        pod_io._request(_url(flaky), "round-000001/update", "GET", limits)
    assert "deadbeef" not in str(info.value) and flaky.seen == 2
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(StoreUnavailable, match="2 attempt") as outage:
        pod_io._request(f"http://127.0.0.1:{port}/k?{SECRET}", "k", "GET", limits)
    assert "deadbeef" not in str(outage.value)
