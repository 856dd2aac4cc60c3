"""A local, scripted, OpenAI-compatible Chat Completions and Responses API server for tests.

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

``POST /v1/responses`` (``stream: true`` only) serves the same replies as Responses streaming
events, and records each request as the Chat Completions request it stands for, the body itself
under ``responses``: ``tests/support/scripted/responses.py`` says how.

``stream: false`` requests get a ``chat.completion`` built from the same Reply: text and
reasoning concatenated, tool calls collected, ``finish_reason`` from ``finish()`` (default
``"tool_calls"`` when there are tool calls, else ``"stop"``), ``usage`` from ``usage()``.
``delay`` events sleep before the response; ``error_event`` becomes an HTTP 500 with that
error body; ``cut()`` closes the connection without any response (the client raises
``APIConnectionError``; note that the ``openai`` client retries both of those by default,
consuming further replies, so use ``max_retries=0`` when scripting them).
"""

from tests.support.scripted.events import (
    Event,
    Reply,
    cut,
    delay,
    error_event,
    finish,
    http_error,
    raw,
    reasoning,
    text,
    tool_call,
    usage,
)
from tests.support.scripted.responses import sealed
from tests.support.scripted.server import ScriptedServer

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
    "sealed",
    "text",
    "tool_call",
    "usage",
]
