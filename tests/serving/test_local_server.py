"""The HTTP endpoint of serve-local, over real sockets, with a small deterministic generator.

The end-to-end test (test_promote_serve_e2e.py) serves a real registered model; these cover
the protocol and its error answers without loading one.
"""

from __future__ import annotations

import json
import logging
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from fedtune.core.errors import ConfigError
from fedtune.serving.local_server import MAX_BODY_BYTES, LocalServer

TIMEOUT = 10


def reverse_words(prompt: str, max_new_tokens: int) -> str:
    """A stand-in model: the prompt's words reversed, cut to max_new_tokens words."""
    if prompt == "explode":
        raise RuntimeError("model crashed")
    return " ".join(prompt.split()[::-1][:max_new_tokens])


def call(
    url: str, path: str, body: Any = None, *, raw: bytes | None = None
) -> tuple[int, dict[str, Any]]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(
        url + path, data=data, method="POST" if data is not None else "GET"
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture
def server() -> Iterator[LocalServer]:
    srv = LocalServer(reverse_words, "toy@champion", port=0, max_new_tokens=2).start()
    yield srv
    srv.stop()


def texts(body: dict[str, Any]) -> list[str]:
    return [choice["text"] for choice in body["choices"]]


def test_health_and_completion(server: LocalServer) -> None:
    assert server.url.startswith("http://127.0.0.1:")
    assert call(server.url, "/health") == (200, {"status": "ok", "model": "toy@champion"})
    status, body = call(server.url, "/v1/completions", {"prompt": "one two three four"})
    assert status == 200 and body["object"] == "text_completion"
    assert body["model"] == "toy@champion" and texts(body) == ["four three"]
    status, body = call(server.url, "/v1/completions", {"prompt": "one two three", "max_tokens": 3})
    assert texts(body) == ["three two one"]


def test_openai_client_shapes(server: LocalServer) -> None:
    """What OpenAI clients send and read: a model list, a prompt list, a named model."""
    status, listed = call(server.url, "/v1/models")
    assert status == 200 and [m["id"] for m in listed["data"]] == ["toy@champion"]
    body = {"model": "toy@champion", "prompt": ["a b", "c d e"], "max_tokens": 5}
    status, answer = call(server.url, "/v1/completions", body)
    assert status == 200 and texts(answer) == ["b a", "e d c"]
    assert [c["index"] for c in answer["choices"]] == [0, 1]


@pytest.mark.parametrize(
    ("path", "body", "raw", "status", "message"),
    [
        ("/v1/completions", None, b"{not json", 400, "not JSON"),
        ("/v1/completions", ["a list"], None, 400, "JSON object"),
        ("/v1/completions", {"text": "hi"}, None, 400, '"prompt"'),
        ("/v1/completions", {"prompt": ""}, None, 400, '"prompt"'),
        ("/v1/completions", {"prompt": ["ok", 3]}, None, 400, '"prompt"'),
        ("/v1/completions", {"prompt": "hi", "model": "other"}, None, 404, "not served here"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, None, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": "5"}, None, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 10**6}, None, 400, "max_tokens"),
        ("/v1/completions", None, b"x" * (MAX_BODY_BYTES + 1), 413, "bytes"),
        ("/v1/chat", {"prompt": "hi"}, None, 404, "Not Found"),
        ("/v1/completions", {"prompt": "explode"}, None, 500, "generation failed"),
    ],
)
def test_bad_requests_get_clear_json_errors_and_the_server_goes_on(
    server: LocalServer, path: str, body: Any, raw: bytes | None, status: int, message: str
) -> None:
    got, answer = call(server.url, path, body, raw=raw)
    assert got == status
    assert message in answer["error"]["message"] and answer["error"]["code"] == status
    assert call(server.url, "/health")[0] == 200


def test_get_on_completions_and_unknown_paths(server: LocalServer) -> None:
    assert call(server.url, "/v1/completions")[0] == 405
    assert call(server.url, "/metrics")[0] == 404


def test_max_requests_stops_the_server() -> None:
    srv = LocalServer(reverse_words, "toy@1", port=0, max_requests=2).start()
    url = srv.url
    assert call(url, "/health")[0] == 200
    assert texts(call(url, "/v1/completions", {"prompt": "a b"})[1]) == ["b a"]
    assert srv._thread is not None
    srv._thread.join(timeout=TIMEOUT)
    assert not srv._thread.is_alive()
    assert srv.handled == 2
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url + "/health", timeout=TIMEOUT)
    srv.stop()


def test_port_in_use_and_bad_settings_are_refused() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            LocalServer(reverse_words, "toy", port=port)
    with pytest.raises(ConfigError, match="--port"):
        LocalServer(reverse_words, "toy", port=70000)
    with pytest.raises(ConfigError, match="--max-requests"):
        LocalServer(reverse_words, "toy", max_requests=0)
    with pytest.raises(ConfigError, match="--max-new-tokens"):
        LocalServer(reverse_words, "toy", max_new_tokens=0)


def test_stop_without_start_releases_the_port() -> None:
    srv = LocalServer(reverse_words, "toy")
    port = int(srv.url.rsplit(":", 1)[1])
    srv.stop()
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))


class _Recording(logging.Handler):
    """A handler that notes whether it was closed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.closed = False
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record.getMessage())

    def close(self) -> None:
        self.closed = True
        super().close()


def test_serving_leaves_the_processs_logging_as_it_was() -> None:
    """serve-local runs inside the process that called it (a CLI run, a notebook, a test):
    it must not close or replace the handlers that process set up, and they keep working."""
    root, mine = logging.getLogger(), _Recording()
    root.addHandler(mine)
    try:
        before = list(root.handlers)
        srv = LocalServer(reverse_words, "toy@1", port=0, max_requests=1).start()
        try:
            with urllib.request.urlopen(f"{srv.url}/health", timeout=10) as response:
                assert response.status == 200
        finally:
            srv.stop()
        assert not mine.closed
        assert root.handlers == before
        logging.getLogger("fedtune.after").warning("still logging")
        assert mine.records[-1] == "still logging"
    finally:
        root.removeHandler(mine)
