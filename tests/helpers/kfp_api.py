"""A small stand-in for the Kubeflow Pipelines REST API (v2beta1), the calls kfp.Client 2.17 makes.

It answers the endpoints `fedtune submit` and the chart's upload hook reach through
``kfp.Client`` — healthz, pipelines (list by name and namespace, create, upload,
upload_version, list versions by name), experiments (list by name, create), runs and
recurring runs (create) — with the JSON shapes of ``kfp_server_api``, keeps what was created,
refuses a second pipeline of one name in one namespace (and a second version of one name in
one pipeline) with HTTP 409 "already exists" as KFP's API server does (a pipeline without a
namespace is shared; listing without ``namespace`` lists the shared ones), and can sit behind a
sign-in gateway: with ``token`` or ``cookie`` set, a request
without that login is redirected to ``/dex/auth`` as oauth2-proxy does (or answered 401 with
``reject_with=401``). No KFP backend can run on these machines; this is what the tests drive.
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

PREFIX = "/apis/v2beta1"


@dataclass
class FakeKfp:
    """State of the fake server: what exists, and every request it saw."""

    token: str | None = None
    cookie: str | None = None
    reject_with: int = 302
    pipelines: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> pipeline
    versions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # pipeline id -> versions
    uploads: dict[str, str] = field(default_factory=dict)  # version id -> uploaded YAML
    experiments: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    recurring_runs: list[dict[str, Any]] = field(default_factory=list)
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    url: str = ""
    _server: ThreadingHTTPServer | None = None

    def start(self) -> FakeKfp:
        state = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:
                state._handle(self, "GET")

            def do_POST(self) -> None:
                state._handle(self, "POST")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # -- dispatch ------------------------------------------------------------------------
    def _signed_in(self, headers: Any) -> bool:
        if self.token is None and self.cookie is None:
            return True
        if self.token is not None and headers.get("Authorization") == f"Bearer {self.token}":
            return True
        cookies = [c.strip() for c in (headers.get("Cookie") or "").split(";")]
        return self.cookie is not None and self.cookie in cookies

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        parts = urlsplit(h.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        body = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        self.requests.append((method, parts.path, dict(h.headers)))
        if not self._signed_in(h.headers):
            if self.reject_with == 302:
                h.send_response(302)
                h.send_header("Location", "/dex/auth?client_id=kubeflow-oidc-authservice")
                h.end_headers()
            else:
                self._json(h, {"error": "unauthorized", "code": 16}, self.reject_with)
            return
        route = parts.path.removeprefix(PREFIX)
        try:
            status, payload = self._route(method, route, query, body, h.headers)
        except KeyError as exc:
            status, payload = 404, {"error": f"not found: {exc}", "code": 5}
        self._json(h, payload, status)

    @staticmethod
    def _json(h: BaseHTTPRequestHandler, payload: Any, status: int = 200) -> None:
        data = json.dumps(payload).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _route(
        self, method: str, route: str, query: dict[str, str], body: bytes, headers: Any
    ) -> tuple[int, Any]:
        if route == "/healthz":
            return 200, {"multi_user": False}
        if method == "GET" and route == "/pipelines":
            wanted, namespace = _filter_name(query), query.get("namespace", "")
            found = [
                p
                for p in self.pipelines.values()
                if wanted in (None, p["display_name"]) and p.get("namespace", "") == namespace
            ]
            return 200, {"pipelines": found, "total_size": len(found)} if found else {}
        if method == "POST" and route == "/pipelines":
            sent = json.loads(body)
            return self._create(sent["display_name"], sent.get("namespace") or "")
        if method == "POST" and route == "/pipelines/upload":
            status, pipeline = self._create(query["name"], query.get("namespace", ""))
            if status == 200:
                self._add_version(pipeline["pipeline_id"], query["name"], _uploaded(body, headers))
            return status, pipeline
        if method == "POST" and route == "/pipelines/upload_version":
            pipeline_id = query["pipelineid"]
            self.pipelines[pipeline_id]  # noqa: B018 - KeyError -> 404
            if any(v["display_name"] == query["name"] for v in self.versions[pipeline_id]):
                return 409, _exists(f"pipeline version {query['name']!r}")
            return 200, self._add_version(pipeline_id, query["name"], _uploaded(body, headers))
        if method == "GET" and route.startswith("/pipelines/") and route.endswith("/versions"):
            pipeline_id, wanted = route.split("/")[2], _filter_name(query)
            newest_first = [
                v for v in reversed(self.versions[pipeline_id]) if wanted in (None, v["display_name"])
            ]
            return 200, {"pipeline_versions": newest_first, "total_size": len(newest_first)}
        if method == "GET" and route == "/experiments":
            wanted = _filter_name(query)
            found = [e for e in self.experiments if wanted in (None, e["display_name"])]
            return 200, {"experiments": found, "total_size": len(found)} if found else {}
        if method == "POST" and route == "/experiments":
            experiment = {**json.loads(body), "experiment_id": str(uuid.uuid4())}
            self.experiments.append(experiment)
            return 200, experiment
        if method == "POST" and route == "/runs":
            run = {**json.loads(body), "run_id": str(uuid.uuid4()), "state": "PENDING"}
            self.runs.append(run)
            return 200, run
        if method == "POST" and route == "/recurringruns":
            recurring = {**json.loads(body), "recurring_run_id": str(uuid.uuid4())}
            self.recurring_runs.append(recurring)
            return 200, recurring
        raise KeyError(f"{method} {route}")

    def _create(self, name: str, namespace: str) -> tuple[int, dict[str, Any]]:
        if any(
            p["display_name"] == name and p.get("namespace", "") == namespace
            for p in self.pipelines.values()
        ):
            return 409, _exists(f"pipeline {name!r} in namespace {namespace!r}")
        pipeline_id = str(uuid.uuid4())
        pipeline = {"pipeline_id": pipeline_id, "display_name": name}
        if namespace:
            pipeline["namespace"] = namespace
        self.pipelines[pipeline_id] = pipeline
        self.versions[pipeline_id] = []
        return 200, pipeline

    def _add_version(self, pipeline_id: str, name: str, text: str) -> dict[str, Any]:
        version = {
            "pipeline_id": pipeline_id,
            "pipeline_version_id": str(uuid.uuid4()),
            "display_name": name,
        }
        self.versions[pipeline_id].append(version)
        self.uploads[version["pipeline_version_id"]] = text
        return version


def _exists(what: str) -> dict[str, Any]:
    """KFP's answer to a duplicate name (gRPC AlreadyExists, code 6)."""
    return {"error": f"Failed to create: {what} already exists", "code": 6}


def _filter_name(query: dict[str, str]) -> str | None:
    if "filter" not in query:
        return None
    predicates = json.loads(query["filter"]).get("predicates") or []
    return next((p.get("stringValue") or p.get("string_value") for p in predicates), None)


def _uploaded(body: bytes, headers: Any) -> str:
    """The ``uploadfile`` part of a multipart/form-data body."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {headers['Content-Type']}\r\n\r\n".encode() + body
    )
    for part in message.iter_parts():
        if part.get_param("name", header="content-disposition") == "uploadfile":
            return str(part.get_payload(decode=True).decode())
    raise KeyError("uploadfile")
