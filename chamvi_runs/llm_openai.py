"""The only module that imports ``openai``: one streamed Chat Completions call -> a ModelTurn."""

from __future__ import annotations

import contextvars
import functools
import logging
import queue
import random
import secrets
import threading
from collections.abc import Iterator
from typing import Any

import openai

from .conf import conf
from .core.storable import storable
from .core.toolcalls import ToolCallAccumulator
from .core.types import Aborted, AbortSignal, ModelRequest, ModelTurn, OnDelta, Usage

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


class OpenAIModel:
    """Streams Chat Completions with tools and usage through the ``openai`` package."""

    def stream(self, request: ModelRequest, on_delta: OnDelta, abort: AbortSignal) -> ModelTurn:
        retries = int(conf.OPENAI.get("max_retries", 2))
        attempt = 0
        while True:
            try:
                return self._stream_once(request, on_delta, abort)
            except RETRYABLE as exc:
                if attempt >= retries:
                    return ModelTurn(error=_describe(exc))
                delay = _backoff(attempt, exc)
                logger.warning(
                    "model call failed (%s); retry %d in %.2fs", _describe(exc), attempt + 1, delay
                )
                attempt += 1
                if abort.wait(delay):
                    raise Aborted(abort.reason) from None
            except openai.APIError as exc:
                return ModelTurn(error=_describe(exc))

    def _stream_once(self, request: ModelRequest, on_delta: OnDelta, abort: AbortSignal) -> ModelTurn:
        kwargs: dict[str, Any] = {
            "model": request.model,
            "messages": request.messages,
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
        received = False
        try:
            for chunk in _pumped(kwargs, abort):
                received = True
                if chunk.usage is not None:
                    turn.usage = Usage(chunk.usage.prompt_tokens or 0, chunk.usage.completion_tokens or 0)
                for choice in chunk.choices or []:
                    delta = choice.delta
                    if delta is not None:
                        # A lone surrogate (an escape a provider split from its partner) cannot be
                        # stored or sent on: each is replaced, so deltas still add up to the step.
                        thought = storable(_reasoning_of(delta))
                        if thought:
                            reasoning.append(thought)
                            on_delta("reasoning", thought)
                        if delta.content:
                            content = storable(delta.content)
                            text.append(content)
                            on_delta("text", content)
                        for tc in delta.tool_calls or []:
                            function = tc.function
                            calls.add(
                                tc.index,
                                storable(tc.id),
                                storable(function.name) if function else None,
                                storable(function.arguments) if function else None,
                            )
                    if choice.finish_reason:
                        turn.finish_reason = choice.finish_reason
        except RETRYABLE as exc:
            if not received:
                raise
            # Part of the answer was already streamed, so nothing is retried. A dropped connection
            # leaves the turn without a finish reason: the engine calls that an incomplete response.
            if not isinstance(exc, openai.APIConnectionError):
                turn.error = _describe(exc)
        except openai.APIError as exc:
            turn.error = _describe(exc)
        except Aborted:
            raise
        except Exception as exc:
            turn.error = _describe(exc)
        turn.text = "".join(text)
        turn.reasoning = "".join(reasoning)
        turn.tool_calls = calls.calls(id_prefix=f"call_{secrets.token_hex(6)}_")
        return turn


_DONE = object()


def _pumped(kwargs: dict[str, Any], abort: AbortSignal) -> Iterator[Any]:
    """Yield the stream's chunks, read by a helper thread, so that an abort is noticed within
    ``POLL`` seconds even while the network read blocks (closing a socket from another thread does
    not wake a blocked read). The abandoned reader is closed and ends with its connection."""
    chunks: queue.Queue[Any] = queue.Queue()
    holder: dict[str, Any] = {}

    def pump() -> None:
        try:
            stream = client().chat.completions.create(**kwargs)
            holder["stream"] = stream
            for chunk in stream:
                chunks.put(chunk)
                if abort.is_set():
                    break
            chunks.put(_DONE)
        except BaseException as exc:  # handed to the consuming thread
            chunks.put(exc)
        finally:
            stream = holder.get("stream")
            if stream is not None:
                stream.close()

    if abort.is_set():
        raise Aborted(abort.reason)
    # In the execution's context: what the openai client logs while reading names the run.
    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(pump,), name="chamvi-model-stream", daemon=True).start()
    while True:
        try:
            item = chunks.get(timeout=POLL)
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
        yield item


def _reasoning_of(delta: Any) -> str:
    # Not in the OpenAI schema: DeepSeek and vLLM send ``reasoning_content``, OpenRouter ``reasoning``.
    thought = getattr(delta, "reasoning_content", None) or getattr(delta, "reasoning", None)
    return thought if isinstance(thought, str) else ""


def _describe(exc: BaseException) -> str:
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
