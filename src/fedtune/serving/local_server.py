"""``fedtune serve-local``: a registered model answering prompts on this machine.

The model is loaded the way MLflow serves it (its pyfunc flavor, i.e. the model code logged
with it), so what answers here is what the registry holds. Prompts come from the command line
or from an HTTP endpoint on 127.0.0.1 (never another interface: it has no authentication),
an ASGI app on FastAPI served by uvicorn that speaks OpenAI's completions protocol, so
OpenAI clients, vLLM's benchmark tools and ``curl`` scripts written for vLLM work unchanged:

- ``GET /health`` -> ``{"status": "ok", "model": "NAME@ALIAS"}``
- ``GET /v1/models`` -> the one model, as OpenAI lists models
- ``POST /v1/completions`` with ``{"prompt": "..." | ["...", ...], "max_tokens": 32}``
  (``model`` and ``max_tokens`` optional) -> ``{"object": "text_completion", "model": ...,
  "choices": [{"index": 0, "text": "...", "finish_reason": "length"}]}``; decoding is greedy.
  Errors answer ``{"error": {"message": ..., "type": ..., "code": STATUS}}``.

Requests are handled one at a time: the model is not thread-safe, and this server exists to
exercise the serving path, not to carry load (KServe with vLLM does that).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from fedtune.core.errors import ConfigError
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
        import uvicorn

        if not 0 <= port <= 65535:
            raise ConfigError(f"--port is {port}", fix="Use a TCP port from 1 to 65535, or 0.")
        if max_requests is not None and max_requests < 1:
            raise ConfigError(f"--max-requests is {max_requests}", fix="Use 1 or more.")
        check_max_new_tokens(max_new_tokens, "--max-new-tokens")
        # Bound here, not when serving starts, so a taken port is a clear error at once.
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # As uvicorn's own sockets: a restart may reuse a port in TIME_WAIT (a port another
        # socket listens on is still refused).
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((HOST, port))
            self._socket.listen()  # clients may connect at once; they wait until uvicorn serves
        except OSError as exc:
            self._socket.close()
            raise ConfigError(
                f"cannot listen on {HOST}:{port}: {exc.strerror}",
                fix="Pick another --port (0 picks a free one).",
            ) from None
        self.label = label
        self.max_requests = max_requests
        self.handled = 0
        from fedtune.serving.openai_app import build_app

        app = build_app(generate, label, max_new_tokens, self._count)
        # log_config=None: uvicorn's default applies logging.config.dictConfig, which closes
        # every handler the process already has (a run's log file, a library's stream), and
        # routes uvicorn's lines past the process's own format. Without it they propagate.
        config = uvicorn.Config(
            app,
            log_config=None,
            log_level="warning",
            access_log=False,
            timeout_keep_alive=int(REQUEST_TIMEOUT_S),
        )
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def _count(self) -> None:
        self.handled += 1
        if self.max_requests is not None and self.handled >= self.max_requests:
            self._server.should_exit = True

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` with the port actually bound."""
        return f"http://{HOST}:{self._socket.getsockname()[1]}"

    def serve(self) -> None:
        """Answer requests in this thread until :meth:`stop` or ``max_requests``."""
        log.info("serving %s on %s", self.label, self.url)
        try:
            self._server.run(sockets=[self._socket])
        finally:
            self._socket.close()

    def start(self) -> LocalServer:
        """Serve from a background thread once it accepts connections; returns self."""
        self._thread = threading.Thread(target=self.serve, name="fedtune-serve-local", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        while not self._server.started and self._thread.is_alive():
            if time.monotonic() > deadline:
                raise RuntimeError(f"serve-local did not start within {REQUEST_TIMEOUT_S:g} s")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop serving and release the port."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join()
        self._socket.close()
