"""The HTTP side: answering each request with the next scripted reply, streamed or not."""

import json
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from tests.support.scripted.events import (
    Cut,
    Delay,
    ErrorEvent,
    Finish,
    HttpError,
    Raw,
    Reasoning,
    Reply,
    Text,
    ToolCall,
    Usage,
)
from tests.support.scripted.responses import chat_view, responses_payloads
from tests.support.scripted.sse import sse_payloads, usage_dict
from tests.support.scripted.state import ServerState


class ScriptedHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    state: ServerState

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients hanging up mid-stream is routine in these tests, not worth a traceback.
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


class _Aborted(Exception):
    """The server is stopping; drop the connection."""


class ScriptedHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ScriptedServer/1.0"

    @property
    def state(self) -> ServerState:
        return cast(ScriptedHTTPServer, self.server).state

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        finally:
            self.close_connection = True

    @contextmanager
    def _busy(self) -> Iterator[None]:
        state = self.state
        with state.idle:
            state.active += 1
        try:
            yield
        finally:
            with state.idle:
                state.active -= 1
                state.idle.notify_all()

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path.endswith("/models"):
            with self.state.lock:
                names = list(self.state.queues)
            data = [{"id": name, "object": "model", "created": 0, "owned_by": "scripted"} for name in names]
            self._send_json(200, {"object": "list", "data": data})
        else:
            self._send_error(404, f"unknown path {self.path}", "not_found_error")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        length = int(self.headers.get("Content-Length") or 0)
        body_bytes = self.rfile.read(length) if length else b""
        responses = path.endswith("/responses")
        if not (responses or path.endswith("/chat/completions")):
            self._send_error(404, f"unknown path {self.path}", "not_found_error")
            return
        try:
            body = json.loads(body_bytes or b"null")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            self._send_error(400, "request body is not a JSON object", "invalid_request_error")
            return
        if responses:
            if not body.get("stream"):
                self._send_error(400, "the scripted server streams Responses only", "invalid_request_error")
                return
            try:
                # Recorded (and given to responders) as the Chat Completions request it stands for.
                body = chat_view(body)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                self._send_error(
                    400, str(exc), "invalid_request_error", extra_headers=(("x-should-retry", "false"),)
                )
                return

        state = self.state
        model = str(body.get("model"))
        with state.lock:
            state.requests.append(body)
            queue = state.queues.get(model)
            reply = queue.popleft() if queue else None
            responder = state.responders.get(model) if reply is None else None
            state.counter += 1
            completion_id = f"{'resp' if responses else 'chatcmpl'}-scripted-{state.counter}"
        if reply is None and responder is not None:
            reply = responder(body)
        if reply is None:
            self._send_error(
                500,
                f"no scripted reply left for model {model}",
                "server_error",
                extra_headers=(("x-should-retry", "false"),),
            )
            return

        with self._busy():
            try:
                if responses:
                    self._stream(reply, model, completion_id, responses=True)
                elif body.get("stream"):
                    self._stream(reply, model, completion_id)
                else:
                    self._complete(reply, model, completion_id)
            except _Aborted:
                pass

    def _sleep(self, seconds: float) -> None:
        if self.state.stopping.wait(seconds):
            raise _Aborted

    def _send_json(
        self, status: int, payload: dict[str, Any], extra_headers: Iterable[tuple[str, str]] = ()
    ) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in extra_headers:
            self.send_header(name, value)
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _send_error(
        self,
        status: int,
        message: str,
        error_type: str,
        code: str | None = None,
        extra_headers: Iterable[tuple[str, str]] = (),
        param: str | None = None,
    ) -> None:
        payload = {"error": {"message": message, "type": error_type, "code": code, "param": param}}
        self._send_json(status, payload, extra_headers)

    def _send_http_error(self, error: HttpError) -> None:
        self._send_error(error.status, error.message, error.type, error.code, error.headers, error.param)

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _drop_connection(self) -> None:
        # A plain FIN is enough: without the terminating zero-length chunk (or, outside a
        # stream, without any status line) the client knows the body is incomplete. An RST
        # could make the client discard chunks it has received but not yet read.
        self.wfile.flush()
        self.close_connection = True

    def _stream(self, reply: Reply, model: str, completion_id: str, responses: bool = False) -> None:
        events = list(reply.events)
        while events and isinstance(head := events[0], Delay):
            self._sleep(head.seconds)
            events.pop(0)
        final_error = reply.final_http_error
        if final_error is not None:
            self._send_http_error(final_error)
            return

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.flush()

        payloads = (responses_payloads if responses else sse_payloads)(
            events, model, completion_id, self._sleep
        )
        for data in payloads:
            if isinstance(data, Cut):
                if data.graceful:
                    self._end_chunks()
                else:
                    self._drop_connection()
                return
            if isinstance(data, tuple):
                self._write_chunk(f"event: {data[0]}\ndata: {data[1]}\n\n".encode())
            else:
                self._write_chunk(f"data: {data}\n\n".encode())
        self._end_chunks()

    def _complete(self, reply: Reply, model: str, completion_id: str) -> None:
        content: list[str] = []
        reasoning_parts: list[str] = []
        tool_calls: list[dict[str, Any]] = []
        finish_reason: str | None = None
        usage_payload: dict[str, int] | None = None
        for event in reply.events:
            match event:
                case Delay(seconds):
                    self._sleep(seconds)
                case HttpError():
                    self._send_http_error(event)
                    return
                case ErrorEvent(error_message, error_type, code):
                    self._send_error(500, error_message, error_type, code)
                    return
                case Cut():
                    self._drop_connection()
                    return
                case Text(value):
                    content.append(value)
                case Reasoning(value):
                    reasoning_parts.append(value)
                case ToolCall(call_id, name, arguments, _, _):
                    tool_calls.append(
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": arguments},
                        }
                    )
                case Finish(reason):
                    finish_reason = reason
                case Usage(prompt, completion):
                    usage_payload = usage_dict(prompt, completion)
                case Raw():
                    pass
        message: dict[str, Any] = {"role": "assistant", "content": "".join(content) if content else None}
        if reasoning_parts:
            message["reasoning_content"] = "".join(reasoning_parts)
        if tool_calls:
            message["tool_calls"] = tool_calls
        if finish_reason is None:
            finish_reason = "tool_calls" if tool_calls else "stop"
        self._send_json(
            200,
            {
                "id": completion_id,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}
                ],
                "usage": usage_payload,
            },
        )
