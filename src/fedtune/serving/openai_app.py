"""The OpenAI-compatible completions app ``serve-local`` runs: FastAPI, served by uvicorn.

Kept apart from :mod:`fedtune.serving.local_server` so importing the CLI does not import
FastAPI, and so FastAPI can read the endpoints' annotations (it needs them at import time).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from fedtune.core.errors import ConfigError, FedtuneError
from fedtune.serving.local_server import MAX_BODY_BYTES, Generate, check_max_new_tokens

log = logging.getLogger(__name__)


def _error(status: HTTPStatus, message: str) -> JSONResponse:
    """An OpenAI-shaped error answer."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return JSONResponse(
        {"error": {"message": message, "type": kind, "code": int(status)}}, status_code=status
    )


class _BadRequest(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def _parse_completion(body: Any, label: str, default_tokens: int) -> tuple[list[str], int]:
    """The prompts and ``max_tokens`` of a completions request, or :class:`_BadRequest`."""
    if not isinstance(body, dict):
        raise _BadRequest(HTTPStatus.BAD_REQUEST, 'send a JSON object {"prompt": "..."}')
    model = body.get("model")
    if model is not None and model != label:
        raise _BadRequest(HTTPStatus.NOT_FOUND, f"model {model!r} is not served here; use {label!r}")
    prompt = body.get("prompt")
    given = prompt if isinstance(prompt, list) else [prompt]
    prompts = [p for p in given if isinstance(p, str) and p]
    if not prompts or len(prompts) != len(given):
        raise _BadRequest(
            HTTPStatus.BAD_REQUEST, '"prompt" must be a non-empty string or a list of them'
        )
    max_tokens = body.get("max_tokens", default_tokens)
    try:
        check_max_new_tokens(max_tokens, '"max_tokens"')
    except ConfigError as exc:
        raise _BadRequest(HTTPStatus.BAD_REQUEST, f"{exc}; {exc.fix}") from None
    return prompts, int(max_tokens)


def build_app(
    generate: Generate, label: str, max_new_tokens: int, on_answer: Callable[[], None]
) -> Any:
    """The FastAPI app: health, the model list and OpenAI completions for ``generate``."""
    app = FastAPI(title="fedtune serve-local", docs_url=None, redoc_url=None, openapi_url=None)
    one_at_a_time = asyncio.Lock()  # the model is not thread-safe

    @app.exception_handler(HTTPException)
    async def _http_error(_: Request, exc: HTTPException) -> Any:
        return _error(HTTPStatus(exc.status_code), f"{exc.detail}")

    @app.middleware("http")
    async def _count(request: Request, call_next: Callable[[Request], Awaitable[Any]]) -> Any:
        try:
            return await call_next(request)
        finally:
            on_answer()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "model": label}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": label, "object": "model", "owned_by": "fedtune"}]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            return _error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_BODY_BYTES} bytes")
        raw = b""
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_BODY_BYTES:
                return _error(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_BODY_BYTES} bytes"
                )
        try:
            body = json.loads(raw or b"null")
            prompts, max_tokens = _parse_completion(body, label, max_new_tokens)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(HTTPStatus.BAD_REQUEST, "the body is not JSON")
        except _BadRequest as exc:
            return _error(exc.status, str(exc))
        try:
            async with one_at_a_time:
                texts = [await run_in_threadpool(generate, p, max_tokens) for p in prompts]
        except FedtuneError as exc:
            return _error(HTTPStatus.INTERNAL_SERVER_ERROR, str(exc))
        except Exception:  # the server must answer, whatever the model raised
            log.exception("generation failed")
            return _error(HTTPStatus.INTERNAL_SERVER_ERROR, "generation failed")
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": label,
            "choices": [
                {"index": i, "text": text, "logprobs": None, "finish_reason": "length"}
                for i, text in enumerate(texts)
            ],
        }

    return app
