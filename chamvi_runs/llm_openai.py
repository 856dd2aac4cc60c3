"""One streamed Chat Completions call -> a ModelTurn; and what both OpenAI adapters share (the
Responses API's is ``llm_responses``): the client, retries, the pump thread, reading server-sent
events. With ``llm_responses``, the only module that imports ``openai``."""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import queue
import random
import secrets
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

import openai

from .conf import conf
from .core.storable import storable
from .core.toolcalls import ToolCallAccumulator
from .core.types import RESPONSE_ITEMS, Aborted, AbortSignal, Message, ModelRequest, ModelTurn, OnDelta, Usage

logger = logging.getLogger(__name__)

POLL = 0.1

# Statuses worth another try: rate limits and server trouble. 4xx other than these are the caller's fault.
RETRYABLE = (
    openai.RateLimitError,
    openai.InternalServerError,
    openai.APIConnectionError,
    openai.APITimeoutError,
)


@functools.cache
def _client(api_key: str | None, base_url: str | None, timeout: float) -> openai.OpenAI:
    # Our own retry loop below can be aborted by cancel and drain; the client's cannot.
    return openai.OpenAI(api_key=api_key or "unset", base_url=base_url, timeout=timeout, max_retries=0)


def client() -> openai.OpenAI:
    options = conf.OPENAI
    return _client(options.get("api_key"), options.get("base_url"), float(options.get("timeout", 600)))


def retrying(once: Callable[[], ModelTurn], abort: AbortSignal) -> ModelTurn:
    """``once()`` again after a rate limit or server trouble that came before any of the answer,
    up to ``OPENAI["max_retries"]`` times, with backoff; then, or for any other error, the error
    in ``ModelTurn.error``. An abort during a backoff raises ``Aborted``."""
    retries = int(conf.OPENAI.get("max_retries", 2))
    attempt = 0
    while True:
        try:
            return once()
        except RETRYABLE as exc:
            if attempt >= retries:
                return ModelTurn(error=describe(exc))
            delay = _backoff(attempt, exc)
            logger.warning("model call failed (%s); retry %d in %.2fs", describe(exc), attempt + 1, delay)
            attempt += 1
            if abort.wait(delay):
                raise Aborted(abort.reason) from None
        except openai.APIError as exc:
            return ModelTurn(error=describe(exc))


class Reading:
    """How reading a stream ends for ``turn``: an error before anything was received is raised (to
    be retried, or reported, by ``retrying``); once part of the answer was streamed nothing is
    retried: a dropped connection leaves the turn without a finish reason (the engine calls that an
    incomplete response), any other error is the turn's. An abort is raised."""

    def __init__(self, turn: ModelTurn) -> None:
        self.turn = turn
        self.received = False
        self.failure: Exception | None = None
        """The error the turn's ``error`` describes."""

    def __enter__(self) -> Reading:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if exc is None or isinstance(exc, Aborted) or not isinstance(exc, Exception):
            return False
        if isinstance(exc, RETRYABLE):
            if not self.received:
                return False
            if not isinstance(exc, openai.APIConnectionError):
                self.turn.error, self.failure = describe(exc), exc
            return True
        self.turn.error, self.failure = describe(exc), exc
        return True


class OpenAIModel:
    """Streams Chat Completions with tools and usage through the ``openai`` package."""

    def stream(self, request: ModelRequest, on_delta: OnDelta, abort: AbortSignal) -> ModelTurn:
        return retrying(lambda: self._stream_once(request, on_delta, abort), abort)

    def _stream_once(self, request: ModelRequest, on_delta: OnDelta, abort: AbortSignal) -> ModelTurn:
        kwargs: dict[str, Any] = {
            "model": request.model,
            "messages": _chat_messages(request.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            kwargs["tools"] = request.tools
        if request.response_format:
            kwargs["response_format"] = request.response_format
        turn = ModelTurn()
        calls = ToolCallAccumulator()
        text: list[str] = []
        reasoning: list[str] = []
        with Reading(turn) as reading:
            # Each chunk is the JSON object the provider sent, read without the client's per-chunk
            # objects (what most of a stream's CPU went to): the fields are the OpenAI schema's.
            for chunk in pumped(client().chat.completions.with_streaming_response.create, kwargs, abort):
                reading.received = True
                usage = chunk.get("usage")
                if usage is not None:
                    turn.usage = Usage(usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0)
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta")
                    if delta is not None:
                        # A lone surrogate (an escape a provider split from its partner) cannot be
                        # stored or sent on: each is replaced, so deltas still add up to the step.
                        thought = storable(_reasoning_of(delta))
                        if thought:
                            reasoning.append(thought)
                            on_delta("reasoning", thought)
                        content = delta.get("content")
                        if content:
                            content = storable(content)
                            text.append(content)
                            on_delta("text", content)
                        for tc in delta.get("tool_calls") or []:
                            function = tc.get("function")
                            calls.add(
                                tc.get("index"),
                                storable(tc.get("id")),
                                storable(function.get("name")) if function else None,
                                storable(function.get("arguments")) if function else None,
                            )
                    if choice.get("finish_reason"):
                        turn.finish_reason = choice["finish_reason"]
        turn.text = "".join(text)
        turn.reasoning = "".join(reasoning)
        turn.tool_calls = calls.calls(id_prefix=f"call_{secrets.token_hex(6)}_")
        return turn


def _chat_messages(messages: list[Message]) -> list[Message]:
    """The history without what Responses API turns keep (``RESPONSE_ITEMS``), which Chat Completions
    providers refuse or ignore (a thread may have had agents of both); the same list when none has it."""
    if not any(RESPONSE_ITEMS in message for message in messages):
        return messages
    return [
        {k: v for k, v in message.items() if k != RESPONSE_ITEMS} if RESPONSE_ITEMS in message else message
        for message in messages
    ]


_DONE = object()


def pumped(
    create: Callable[..., AbstractContextManager[Any]], kwargs: dict[str, Any], abort: AbortSignal
) -> Iterator[dict[str, Any]]:
    """Yield the stream's chunks, read by a helper thread, so that an abort is noticed within
    ``POLL`` seconds even while the network read blocks (closing a socket from another thread does
    not wake a blocked read). The abandoned reader is closed and ends with its connection. The
    chunks of one network read cross between the threads together: one hand-off each."""
    batches: queue.Queue[Any] = queue.Queue()

    def pump() -> None:
        try:
            # The client still makes the request: its errors, statuses, headers and timeouts.
            with create(**kwargs) as response:
                for batch in _batches(response):
                    batches.put(batch)
                    if abort.is_set():
                        break
            batches.put(_DONE)
        except BaseException as exc:  # handed to the consuming thread
            batches.put(exc)

    if abort.is_set():
        raise Aborted(abort.reason)
    # In the execution's context: what the openai client logs while reading names the run.
    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(pump,), name="chamvi-model-stream", daemon=True).start()
    while True:
        try:
            item = batches.get(timeout=POLL)
        except queue.Empty:
            if abort.is_set():
                raise Aborted(abort.reason) from None
            continue
        if abort.is_set():
            raise Aborted(abort.reason)
        if item is _DONE:
            return
        if isinstance(item, BaseException):
            raise item
        yield from item


def _batches(response: Any) -> Iterator[list[dict[str, Any]]]:
    """The chunks (events) of a streamed response, those of each network read together, as
    the ``openai`` client's own stream reads them: each server-sent event's data is one JSON chunk,
    ``[DONE]`` ends the stream, and a chunk with an ``error`` is the provider's error
    (``APIError``), raised after the chunks before it. A failed read is a cut connection
    (``APIConnectionError``), whatever the client's HTTP library called it."""
    data: list[bytes] = []
    for lines in _reads(response):
        batch: list[dict[str, Any]] = []
        for line in lines:
            if line:
                if line.startswith(b"data:"):
                    value = line[5:]
                    data.append(value[1:] if value.startswith(b" ") else value)
                continue  # event:, id:, retry: and comments: a Responses event names its type in its data too
            if not data:
                continue
            payload = b"\n".join(data)
            data = []
            if payload.startswith(b"[DONE]"):
                if batch:
                    yield batch
                return
            chunk = json.loads(payload)
            if isinstance(chunk, dict) and chunk.get("error"):
                if batch:
                    yield batch
                raise _streamed_error(chunk["error"], response)
            batch.append(chunk)
        if batch:
            yield batch


def _streamed_error(error: Any, response: Any) -> openai.APIError:
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(message, str) or not message:
        message = "An error occurred during streaming"
    return openai.APIError(message, response.http_request, body=error)


def _reads(response: Any) -> Iterator[list[bytes]]:
    """The lines each network read completes, without their line ends; the end of the response
    ends a last line and a last event (one not ended by a blank line still counts)."""
    rest = b""
    blocks = response.iter_bytes()
    while True:
        try:
            block = next(blocks)
        except StopIteration:
            break
        except Exception as exc:
            raise openai.APIConnectionError(request=response.http_request) from exc
        *lines, rest = (rest + block).split(b"\n")
        yield [line.rstrip(b"\r") for line in lines]
    yield [rest.rstrip(b"\r"), b""] if rest else [b""]


def _reasoning_of(delta: dict[str, Any]) -> str:
    # Not in the OpenAI schema: DeepSeek and vLLM send ``reasoning_content``, OpenRouter ``reasoning``.
    thought = delta.get("reasoning_content") or delta.get("reasoning")
    return thought if isinstance(thought, str) else ""


def describe(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return f"HTTP {status}: {message}" if status else message


def _backoff(attempt: int, exc: BaseException) -> float:
    base = conf.MODEL_BACKOFF_SECONDS
    response = getattr(exc, "response", None)
    header = response.headers.get("retry-after") if response is not None else None
    if header:
        try:
            return min(float(header), 60.0)
        except ValueError:
            pass
    return base * (2.0**attempt) * (0.5 + random.random() / 2)
