"""A real OpenAI-style completions endpoint inside the test process, serving a tiny model.

It answers ``POST`` with ``echo`` + ``logprobs`` the way vLLM does: per choice, ``tokens`` and
``top_logprobs`` where entry 0 is ``None`` and entry j holds the top-k log-probabilities of
the token at j given the tokens before it (the last entry is the one generated token's).
Tokens are keyed ``token_id:N`` when the request asks ``return_tokens_as_token_ids``,
otherwise by the tokenizer's token strings.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch


@dataclass
class CompletionsServer:
    """A running endpoint; ``requests`` records (body, headers) of every request received."""

    model: torch.nn.Module
    tokenizer: Any
    url: str = ""
    api_key: str | None = None
    model_name: str = "tiny-large"  # the model the endpoint serves (the request's "model")
    token_ids: bool = True  # honour return_tokens_as_token_ids
    fail_next: list[int] = field(default_factory=list)  # statuses to answer before succeeding
    requests: list[tuple[dict[str, Any], dict[str, str]]] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> CompletionsServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append((body, dict(self.headers)))
                if server.api_key and self.headers.get("Authorization") != f"Bearer {server.api_key}":
                    return self._send(401, {"error": {"message": "invalid api key"}})
                if server.fail_next:
                    return self._send(server.fail_next.pop(0), {"error": {"message": "busy"}})
                if body.get("model") != server.model_name:
                    return self._send(404, {"error": {"message": f"model {body.get('model')} not found"}})
                return self._send(200, server.complete(body))

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1/completions"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @torch.no_grad()
    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        k = int(body["logprobs"])
        as_ids = self.token_ids and body.get("return_tokens_as_token_ids")
        choices = []
        for index, prompt in enumerate(body["prompt"]):
            ids = torch.tensor([prompt])
            logp = torch.log_softmax(self.model(input_ids=ids).logits[0].float(), dim=-1)
            next_id = int(logp[-1].argmax())
            top = [None]
            for position in range(len(prompt)):
                values, indices = logp[position].topk(k)
                top.append({self._key(int(i), as_ids): float(v) for v, i in zip(values, indices, strict=True)})
            tokens = [self._key(int(i), as_ids) for i in prompt + [next_id]]
            choices.append(
                {
                    "index": index,
                    "text": "",
                    "logprobs": {"tokens": tokens, "top_logprobs": top},
                    "finish_reason": "length",
                }
            )
        return {"object": "text_completion", "model": body["model"], "choices": choices}

    def _key(self, token_id: int, as_ids: bool) -> str:
        if as_ids:
            return f"token_id:{token_id}"
        return self.tokenizer.convert_ids_to_tokens(token_id)
