"""A local, scripted, OpenAI-compatible Chat Completions server for tests.

Usage::

    with ScriptedServer() as server:
        server.script("model-a", [Reply(text("Hel"), text("lo"), finish("stop"), usage(10, 5))])
        client = OpenAI(base_url=server.base_url, api_key="test")
        stream = client.chat.completions.create(model="model-a", messages=[...], stream=True)

It is real HTTP on ``127.0.0.1`` with a random free port, one thread per request, so it
can be reached from worker subprocesses and serve several streams at once.

Each request to ``POST /v1/chat/completions`` consumes the next scripted ``Reply`` for the
model named in its body (FIFO). A request for a model with no reply left is answered with
HTTP 500 ``no scripted reply left for model X`` (and ``x-should-retry: false`` so the
``openai`` client fails at once instead of retrying).

Streamed responses use ``Transfer-Encoding: chunked`` with ``Connection: close``, exactly
like a real provider, which lets ``cut()`` simulate a dropped connection. As observed with
the installed ``openai`` client (httpx2 transport):

* ``cut()`` (the default, ``graceful=False``): the socket is closed in the middle of the
  chunked body. Iterating the stream yields every chunk sent before the cut and then raises
  ``openai.APIConnectionError`` ("Connection error."), whose ``__cause__`` is the
  transport's ``RemoteProtocolError`` (incomplete chunked read). No chunk with a
  ``finish_reason`` is ever seen.
* ``cut(graceful=True)``: the HTTP body is terminated properly but without a
  ``finish_reason`` chunk and without ``data: [DONE]``. Iteration simply stops, no
  exception; the consumer has to notice the missing ``finish_reason`` itself.
* ``error_event(msg)``: the chunks before it are yielded, then iteration raises
  ``openai.APIError`` whose ``message`` is ``msg`` and whose ``body`` is the error dict.

``stream: false`` requests get a ``chat.completion`` built from the same Reply: text and
reasoning concatenated, tool calls collected, ``finish_reason`` from ``finish()`` (default
``"tool_calls"`` when there are tool calls, else ``"stop"``), ``usage`` from ``usage()``.
``delay`` events sleep before the response; ``error_event`` becomes an HTTP 500 with that
error body; ``cut()`` closes the connection without any response (the client raises
``APIConnectionError``; note that the ``openai`` client retries both of those by default,
consuming further replies, so use ``max_retries=0`` when scripting them).
"""

import json
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeAlias, cast

__all__ = [
    "Event",
    "Reply",
    "ScriptedServer",
    "cut",
    "delay",
    "error_event",
    "finish",
    "http_error",
    "raw",
    "reasoning",
    "text",
    "tool_call",
    "usage",
]


@dataclass(frozen=True)
class Text:
    content: str


@dataclass(frozen=True)
class Reasoning:
    content: str


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    index: int | None
    chunks: int


@dataclass(frozen=True)
class Finish:
    reason: str


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class ErrorEvent:
    message: str
    type: str
    code: str | None


@dataclass(frozen=True)
class Cut:
    graceful: bool


@dataclass(frozen=True)
class Delay:
    seconds: float


@dataclass(frozen=True)
class HttpError:
    status: int
    message: str
    type: str
    code: str | None
    headers: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Raw:
    payload: str


Event: TypeAlias = Text | Reasoning | ToolCall | Finish | Usage | ErrorEvent | Cut | Delay | HttpError | Raw


def text(content: str) -> Text:
    """A chunk whose ``choices[0].delta.content`` is ``content``."""
    return Text(content)


def reasoning(content: str) -> Reasoning:
    """A chunk whose ``choices[0].delta.reasoning_content`` is ``content`` (DeepSeek/vLLM style)."""
    return Reasoning(content)


def tool_call(id: str, name: str, arguments: str, index: int | None = None, chunks: int = 2) -> ToolCall:
    """Streaming tool-call deltas.

    The first delta carries ``index``, ``id``, ``type: "function"`` and
    ``function: {name, arguments: ""}``; ``arguments`` then follows split into ``chunks``
    deltas carrying only ``index`` and ``function.arguments``. ``chunks=0`` puts the whole
    ``arguments`` in the first delta instead. ``index`` defaults to the number of distinct
    tool-call ids earlier in the same Reply.
    """
    if chunks < 0:
        raise ValueError("chunks must be >= 0")
    return ToolCall(id, name, arguments, index, chunks)


def finish(reason: str) -> Finish:
    """A chunk with an empty delta and ``finish_reason = reason``."""
    return Finish(reason)


def usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    """A final ``choices: []`` chunk carrying ``usage`` (as sent with ``include_usage``)."""
    return Usage(prompt_tokens, completion_tokens)


def error_event(message: str, type: str = "server_error", code: str | None = None) -> ErrorEvent:
    """A mid-stream ``data: {"error": {...}}`` chunk, after which the stream ends. Must be last."""
    return ErrorEvent(message, type, code)


def cut(graceful: bool = False) -> Cut:
    """End the stream without a ``finish_reason`` and without ``data: [DONE]``. Must be last.

    ``graceful=False`` drops the connection mid-body (client: ``APIConnectionError``);
    ``graceful=True`` ends the HTTP body cleanly (client: iteration just stops).
    """
    return Cut(graceful)


def delay(seconds: float) -> Delay:
    """Sleep before sending the next event."""
    return Delay(seconds)


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def http_error(
    status: int,
    message: str,
    type: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> HttpError:
    """An HTTP error response with body ``{"error": {"message", "type", "code"}}``.

    Every error carries ``retry-after: 0`` and ``retry-after-ms: 1``: the installed
    ``openai`` client ignores a zero ``retry-after`` and falls back to its exponential
    backoff (0.5 s, 1 s, ...), whereas ``retry-after-ms: 1`` makes its retries immediate.
    ``headers`` adds or overrides headers (e.g. ``{"x-should-retry": "false"}``).
    May only be preceded by ``delay`` events and must be last.
    """
    if status < 400:
        raise ValueError("http_error status must be >= 400")
    error_type = type or _ERROR_TYPES.get(
        status, "server_error" if status >= 500 else "invalid_request_error"
    )
    if code is None and status == 429:
        code = "rate_limit_exceeded"
    merged = {"retry-after": "0", "retry-after-ms": "1"}
    merged.update({k.lower(): v for k, v in (headers or {}).items()})
    return HttpError(status, message, error_type, code, tuple(merged.items()))


def raw(payload: str | dict[str, Any]) -> Raw:
    """Send ``data: <payload>`` verbatim (a dict is JSON-encoded as is), for malformed-stream tests."""
    return Raw(payload if isinstance(payload, str) else json.dumps(payload))


class Reply:
    """One scripted response: a sequence of events, validated on construction."""

    def __init__(self, *events: Event) -> None:
        for position, event in enumerate(events):
            is_last = position == len(events) - 1
            if isinstance(event, ErrorEvent | Cut | HttpError) and not is_last:
                raise ValueError(f"{type(event).__name__} must be the last event of a Reply")
            if isinstance(event, HttpError) and not all(isinstance(e, Delay) for e in events[:position]):
                raise ValueError("http_error may only be preceded by delay events")
        self.events: tuple[Event, ...] = events

    def __repr__(self) -> str:
        return f"Reply{self.events!r}"

    @property
    def final_http_error(self) -> HttpError | None:
        last = self.events[-1] if self.events else None
        return last if isinstance(last, HttpError) else None


@dataclass
class _State:
    queues: dict[str, deque[Reply]] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)
    active: int = 0
    idle: threading.Condition = field(default_factory=threading.Condition)
    counter: int = 0
    responders: dict[str, Callable[[dict[str, Any]], "Reply"]] = field(default_factory=dict)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    state: _State

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients hanging up mid-stream is routine in these tests, not worth a traceback.
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


class _Aborted(Exception):
    """The server is stopping; drop the connection."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ScriptedServer/1.0"

    @property
    def state(self) -> _State:
        return cast(_HTTPServer, self.server).state

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
        if not path.endswith("/chat/completions"):
            self._send_error(404, f"unknown path {self.path}", "not_found_error")
            return
        try:
            body = json.loads(body_bytes or b"null")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            self._send_error(400, "request body is not a JSON object", "invalid_request_error")
            return

        state = self.state
        model = str(body.get("model"))
        with state.lock:
            state.requests.append(body)
            queue = state.queues.get(model)
            reply = queue.popleft() if queue else None
            responder = state.responders.get(model) if reply is None else None
            state.counter += 1
            completion_id = f"chatcmpl-scripted-{state.counter}"
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
                if body.get("stream"):
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
    ) -> None:
        payload = {"error": {"message": message, "type": error_type, "code": code, "param": None}}
        self._send_json(status, payload, extra_headers)

    def _send_http_error(self, error: HttpError) -> None:
        self._send_error(error.status, error.message, error.type, error.code, error.headers)

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

    def _stream(self, reply: Reply, model: str, completion_id: str) -> None:
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

        for data in _sse_payloads(events, model, completion_id, self._sleep):
            if isinstance(data, Cut):
                if data.graceful:
                    self._end_chunks()
                else:
                    self._drop_connection()
                return
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
                case ErrorEvent(message, error_type, code):
                    self._send_error(500, message, error_type, code)
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
                    usage_payload = _usage_dict(prompt, completion)
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


def _usage_dict(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _split(value: str, pieces: int) -> list[str]:
    if pieces <= 0 or not value:
        return []
    size = -(-len(value) // pieces)
    return [value[i : i + size] for i in range(0, len(value), size)]


def _sse_payloads(
    events: list[Event], model: str, completion_id: str, sleep: Callable[[float], None]
) -> Iterator[str | Cut]:
    """The ``data:`` payloads of a streamed reply (``[DONE]`` included), or a final ``Cut``."""
    created = int(time.time())
    role_sent = False
    seen_ids: list[str] = []

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> str:
        nonlocal role_sent
        if not role_sent:
            delta = {"role": "assistant", **delta}
            role_sent = True
        return json.dumps(
            {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
            }
        )

    for event in events:
        match event:
            case Delay(seconds):
                sleep(seconds)
            case Text(value):
                yield chunk({"content": value})
            case Reasoning(value):
                yield chunk({"reasoning_content": value})
            case ToolCall(call_id, name, arguments, index, pieces):
                if call_id not in seen_ids:
                    seen_ids.append(call_id)
                if index is None:
                    index = seen_ids.index(call_id)
                first_args = arguments if pieces == 0 else ""
                yield chunk(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": call_id,
                                "type": "function",
                                "function": {"name": name, "arguments": first_args},
                            }
                        ]
                    }
                )
                for piece in _split(arguments, pieces):
                    yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            case Finish(reason):
                yield chunk({}, reason)
            case Usage(prompt, completion):
                yield json.dumps(
                    {
                        "id": completion_id,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": _usage_dict(prompt, completion),
                    }
                )
            case ErrorEvent(message, error_type, code):
                yield json.dumps(
                    {"error": {"message": message, "type": error_type, "code": code, "param": None}}
                )
                return
            case Cut():
                yield event
                return
            case Raw(payload):
                yield payload
            case HttpError():
                raise AssertionError("http_error is handled before streaming starts")
    yield "[DONE]"


class ScriptedServer:
    """Threaded scripted Chat Completions server on ``127.0.0.1:<free port>``.

    Use as a context manager (or call ``start()``/``stop()``). ``script()`` may be called
    before or while the server runs.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._state = _State()
        self._host = host
        self._port = port
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "ScriptedServer":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        if self._httpd is not None:
            raise RuntimeError("ScriptedServer already started")
        self._state.stopping.clear()
        httpd = _HTTPServer((self._host, self._port), _Handler)
        httpd.state = self._state
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="ScriptedServer", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting, abort pending ``delay`` events, wait for in-flight responses."""
        httpd, thread = self._httpd, self._thread
        if httpd is None or thread is None:
            return
        self._state.stopping.set()
        httpd.shutdown()
        with self._state.idle:
            self._state.idle.wait_for(lambda: self._state.active == 0, timeout)
        httpd.server_close()
        thread.join(timeout)
        self._httpd = self._thread = None

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("ScriptedServer is not running")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://{self._host}:{self.port}/v1"

    def script(self, model: str, replies: Reply | Iterable[Reply]) -> None:
        """Append replies to ``model``'s FIFO queue; one is consumed per request."""
        batch = [replies] if isinstance(replies, Reply) else list(replies)
        for reply in batch:
            if not isinstance(reply, Reply):
                raise TypeError(f"expected Reply, got {reply!r}")
        with self._state.lock:
            self._state.queues.setdefault(model, deque()).extend(batch)

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Parsed JSON bodies of all chat-completion requests, in arrival order (a copy)."""
        with self._state.lock:
            return list(self._state.requests)

    def requests_for(self, model: str) -> list[dict[str, Any]]:
        with self._state.lock:
            return [body for body in self._state.requests if body.get("model") == model]

    def remaining(self, model: str) -> int:
        """Number of scripted replies for ``model`` not yet consumed."""
        with self._state.lock:
            return len(self._state.queues.get(model, ()))

    def respond(self, model: str, responder: Callable[[dict[str, Any]], Reply] | None) -> None:
        """Answer requests for ``model`` that find no scripted reply with ``responder(request body)``
        (None removes it): for tests where many runs share one model and replies depend on history."""
        with self._state.lock:
            if responder is None:
                self._state.responders.pop(model, None)
            else:
                self._state.responders[model] = responder

    def leftovers(self) -> dict[str, int]:
        """Models with scripted replies not yet consumed, and how many."""
        with self._state.lock:
            return {model: len(queue) for model, queue in self._state.queues.items() if queue}

    def clear(self) -> None:
        """Forget every unconsumed reply and recorded request."""
        with self._state.lock:
            self._state.queues.clear()
            self._state.requests.clear()
            self._state.responders.clear()
