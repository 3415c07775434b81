"""A scripted HTTP server that speaks just enough of the OpenAI and Anthropic APIs for the provider tests.

Each request takes the next item of the script: a ``Reply``, a ``Status`` (an error response) or a ``Hang`` (a slow
reply). Standard library only, bound to 127.0.0.1 on a free port, served from a daemon thread.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Union


@dataclass(frozen=True)
class Reply:
    text: str
    input_tokens: int = 10
    output_tokens: int = 5


@dataclass(frozen=True)
class Status:
    code: int
    body: dict[str, Any] | None = None  # None: an error body in the flavour of the request's API
    # The SDKs read "0" as no advice and back off on their own (0.5 s and up); a millisecond keeps retries fast.
    retry_after: str = "0.001"


@dataclass(frozen=True)
class Hang:
    seconds: float
    then: Reply = Reply("late reply")  # sent after the wait, unless the server stops first


Item = Union[Reply, Status, Hang]

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 429: "rate_limit_error", 529: "overloaded_error"}


def _openai_reply(item: Reply, model: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": item.text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": item.input_tokens, "completion_tokens": item.output_tokens,
                  "total_tokens": item.input_tokens + item.output_tokens},
    }


def _anthropic_reply(item: Reply, model: str) -> dict[str, Any]:
    return {
        "id": "msg_scripted", "type": "message", "role": "assistant", "model": model,
        "content": [{"type": "text", "text": item.text}], "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": item.input_tokens, "output_tokens": item.output_tokens},
    }


def _error_body(anthropic: bool, code: int, message: str) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(code, "api_error")
    if anthropic:
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
        pass

    def do_POST(self) -> None:
        srv = self.server.owner
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        with srv._lock:
            srv.requests.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                 "body": body})
            item = srv._script.pop(0) if srv._script else None
            srv._in_flight += 1
            srv.max_in_flight = max(srv.max_in_flight, srv._in_flight)
        self._open = True
        try:
            self._answer(srv, item, body if isinstance(body, dict) else {})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout): nothing left to tell it
        finally:
            self._close_request(srv)

    def _close_request(self, srv: ScriptedServer) -> None:
        """The request stops counting as in flight once its answer is about to go out: the client may send its next
        request as soon as it has the answer, before this thread runs again."""
        if getattr(self, "_open", False):
            self._open = False
            with srv._lock:
                srv._in_flight -= 1

    def _answer(self, srv: ScriptedServer, item: Item | None, body: dict[str, Any]) -> None:
        anthropic = self.path.rstrip("/").endswith("/v1/messages")
        if not anthropic and not self.path.rstrip("/").endswith("/v1/chat/completions"):
            self._send(404, _error_body(False, 404, f"scripted server: no route {self.path}"))
            return
        if item is None:
            self._send(500, _error_body(anthropic, 500, "scripted server: script exhausted"))
            return
        if isinstance(item, Hang):
            if srv._stopping.wait(item.seconds):
                self.close_connection = True
                return
            item = item.then
        if isinstance(item, Status):
            payload = item.body if item.body is not None else _error_body(anthropic, item.code, f"scripted {item.code}")
            self._send(item.code, payload, {"retry-after": item.retry_after})
            return
        model = str(body.get("model", "scripted"))
        self._send(200, _anthropic_reply(item, model) if anthropic else _openai_reply(item, model))

    def _send(self, code: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self._close_request(self.server.owner)
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: ScriptedServer


class ScriptedServer:
    """``with ScriptedServer([Reply("hi")]) as srv:`` then point a client at ``srv.openai_base_url``."""

    def __init__(self, script: list[Item] | None = None) -> None:
        self._script: list[Item] = list(script or [])
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._in_flight = 0
        self.requests: list[dict[str, Any]] = []
        self.max_in_flight = 0
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> ScriptedServer:
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="scripted-llm-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._stopping.set()  # cuts every Hang short
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    @property
    def anthropic_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return f"{self.anthropic_base_url}/v1"

    base_url = openai_base_url

    @property
    def remaining(self) -> int:
        """Script items not yet consumed."""
        with self._lock:
            return len(self._script)
