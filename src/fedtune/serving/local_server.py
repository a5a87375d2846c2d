"""``fedtune serve-local``: a registered model answering prompts on this machine.

The model is loaded the way MLflow serves it (its pyfunc flavor, i.e. the model code logged
with it), so what answers here is what the registry holds. Prompts come from the command line
or from a tiny HTTP endpoint on 127.0.0.1 (never another interface: it has no
authentication), built on the standard library:

- ``GET /health`` -> ``{"status": "ok", "model": "NAME@ALIAS"}``
- ``POST /v1/completions`` with ``{"prompt": "...", "max_tokens": 32}`` (``max_tokens``
  optional) -> ``{"model": "NAME@ALIAS", "text": "..."}``; decoding is greedy.

Requests are handled one at a time: the model is not thread-safe, and this server exists to
exercise the serving path, not to carry load (KServe does that).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

from fedtune.core.errors import ConfigError, FedtuneError
from fedtune.serving.mlflow_registry import ModelRegistry, load_pyfunc
from fedtune.serving.refs import ModelSpec

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
MAX_BODY_BYTES = 64 * 1024
MAX_NEW_TOKENS_LIMIT = 1024
REQUEST_TIMEOUT_S = 30.0

Generate = Callable[[str, int], str]
"""Maps (prompt, max_new_tokens) to the generated continuation."""


def check_max_new_tokens(value: int, where: str) -> int:
    """Return ``value`` if it is a sensible number of new tokens.

    Raises:
        ConfigError: It is not a whole number in ``1..MAX_NEW_TOKENS_LIMIT``.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 1 <= value <= MAX_NEW_TOKENS_LIMIT
    ):
        raise ConfigError(
            f"{where} is {value!r}",
            fix=f"Use a whole number from 1 to {MAX_NEW_TOKENS_LIMIT}.",
        )
    return value


def load_generator(registry: ModelRegistry, spec: ModelSpec, workdir: Path) -> Generate:
    """Download the version ``spec`` names into ``workdir`` and load it for generation.

    Raises:
        StoreError: The model, version or alias does not exist, or the download fails.
        ModelError: The files cannot be loaded as a model.
    """
    import pandas as pd  # an mlflow dependency, like the pyfunc input format

    record = registry.version(spec)
    local = registry.download(record, workdir)
    model = load_pyfunc(local)
    log.info("loaded %s (version %d) from %s", spec, record.version, record.location)

    def generate(prompt: str, max_new_tokens: int) -> str:
        frame = pd.DataFrame({"prompt": [prompt]})
        outputs = model.predict(frame, params={"max_new_tokens": max_new_tokens})
        return str(next(iter(outputs)))

    return generate


class _BadRequest(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT_S  # a stalled client cannot hold the single worker forever

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: HTTPStatus, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _finish(self) -> None:
        self.server.count_request()

    def do_GET(self) -> None:
        try:
            if self.path == "/health":
                self._send(HTTPStatus.OK, {"status": "ok", "model": self.server.label})
            elif self.path == "/v1/completions":
                self._send(HTTPStatus.METHOD_NOT_ALLOWED, {"error": "use POST"})
            else:
                self._send(HTTPStatus.NOT_FOUND, {"error": f"no such path {self.path!r}"})
        finally:
            self._finish()

    def do_POST(self) -> None:
        try:
            if self.path != "/v1/completions":
                self._send(HTTPStatus.NOT_FOUND, {"error": f"no such path {self.path!r}"})
                return
            try:
                prompt, max_tokens = self._read_request()
            except _BadRequest as exc:
                self._send(exc.status, {"error": str(exc)})
                return
            try:
                text = self.server.generate(prompt, max_tokens)
            except FedtuneError as exc:
                self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": str(exc)})
                return
            except Exception:  # the server must answer, whatever the model raised
                log.exception("generation failed")
                self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "generation failed"})
                return
            self._send(HTTPStatus.OK, {"model": self.server.label, "text": text})
        finally:
            self._finish()

    def _read_request(self) -> tuple[str, int]:
        length_header = self.headers.get("Content-Length")
        if length_header is None or not length_header.isdigit():
            raise _BadRequest(HTTPStatus.LENGTH_REQUIRED, "send a Content-Length header")
        length = int(length_header)
        if length > MAX_BODY_BYTES:
            raise _BadRequest(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_BODY_BYTES} bytes"
            )
        try:
            body = json.loads(self.rfile.read(length) or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "the body is not JSON") from None
        if not isinstance(body, dict):
            raise _BadRequest(HTTPStatus.BAD_REQUEST, 'send a JSON object {"prompt": "..."}')
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise _BadRequest(HTTPStatus.BAD_REQUEST, '"prompt" must be a non-empty string')
        max_tokens = body.get("max_tokens", self.server.max_new_tokens)
        try:
            check_max_new_tokens(max_tokens, '"max_tokens"')
        except ConfigError as exc:
            raise _BadRequest(HTTPStatus.BAD_REQUEST, f"{exc}; {exc.fix}") from None
        return prompt, int(max_tokens)


class _Server(HTTPServer):
    def __init__(
        self,
        port: int,
        generate: Generate,
        label: str,
        max_new_tokens: int,
        max_requests: int | None,
    ) -> None:
        super().__init__((HOST, port), _Handler)
        self.generate = generate
        self.label = label
        self.max_new_tokens = max_new_tokens
        self.max_requests = max_requests
        self.handled = 0

    def count_request(self) -> None:
        self.handled += 1
        if self.max_requests is not None and self.handled >= self.max_requests:
            # shutdown() waits for serve_forever, which runs in this very thread: ask another.
            threading.Thread(target=self.shutdown, daemon=True).start()


class LocalServer:
    """The HTTP endpoint of ``serve-local``, bound to 127.0.0.1 when constructed.

    Args:
        generate: The model.
        label: How responses name the model (``NAME@ALIAS``).
        port: TCP port; 0 picks a free one (see :attr:`url`).
        max_new_tokens: Default number of new tokens per request.
        max_requests: Stop after this many requests (any path); None serves until stopped.

    Raises:
        ConfigError: The port is out of range or cannot be bound.
    """

    def __init__(
        self,
        generate: Generate,
        label: str,
        *,
        port: int = 0,
        max_new_tokens: int = 32,
        max_requests: int | None = None,
    ) -> None:
        if not 0 <= port <= 65535:
            raise ConfigError(f"--port is {port}", fix="Use a TCP port from 1 to 65535, or 0.")
        if max_requests is not None and max_requests < 1:
            raise ConfigError(f"--max-requests is {max_requests}", fix="Use 1 or more.")
        check_max_new_tokens(max_new_tokens, "--max-new-tokens")
        try:
            self._httpd = _Server(port, generate, label, max_new_tokens, max_requests)
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {HOST}:{port}: {exc.strerror}",
                fix="Pick another --port (0 picks a free one).",
            ) from None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` with the port actually bound."""
        return f"http://{HOST}:{self._httpd.server_address[1]}"

    @property
    def handled(self) -> int:
        """Requests answered so far."""
        return self._httpd.handled

    def serve(self) -> None:
        """Answer requests in this thread until :meth:`stop` or ``max_requests``."""
        log.info("serving %s on %s", self._httpd.label, self.url)
        try:
            self._httpd.serve_forever(poll_interval=0.05)
        finally:
            self._httpd.server_close()

    def start(self) -> LocalServer:
        """Serve from a background thread; returns self."""
        self._thread = threading.Thread(target=self.serve, name="fedtune-serve-local", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port."""
        if self._thread is not None:
            # Only a started loop may be shut down: shutdown() waits for it to end.
            self._httpd.shutdown()
            self._thread.join()
        self._httpd.server_close()
