"""The only module that imports ``mcp``: one kept session per MCP server and process.

Connecting costs far more than calling (a stdio server is a process to start, about half a second;
a call on a kept session takes milliseconds), so each process keeps one session per server
(``Target``: toolsets that name the same server share it, also those a tools factory builds anew
for every execution), in an event loop of its own on a daemon thread, and every execution thread
of the process calls through it. A session whose transport failed (the server died or restarted,
the connection broke) is dropped, and the next call connects again: a server that is down costs
each call at most ``connect_timeout``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import anyio
import httpx2
import mcp
from django.views.decorators.debug import sensitive_variables
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, RequestParamsMeta

T = TypeVar("T")

CONNECTION_CLOSED = -32000
HTTP_READ_SECONDS = 300.0
"""The mcp package's own read timeout for HTTP: a server may hold a response stream open."""

TRANSPORT_ERRORS = (
    OSError,
    EOFError,
    httpx2.TransportError,
    anyio.ClosedResourceError,
    anyio.BrokenResourceError,
    anyio.EndOfStream,
)
"""What a broken connection raises: the session that saw it is dropped, for every thread."""


class Unreachable(Exception):
    """The server could not be reached, or did not answer in time: the call did not run there, or
    its outcome is unknown."""


class Refused(Exception):
    """The server answered with an error of the protocol (an unknown tool, invalid params), or its
    answer was not what the protocol allows: the call's error, not the connection's."""


@dataclass(frozen=True)
class Target:
    """Where a server is: a command (stdio) or a URL (streamable HTTP). ``env`` and ``headers``
    may hold secrets: they are never in its ``repr``, hence in no log or error report."""

    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    cwd: str | None = None
    url: str = ""
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    @sensitive_variables("params", "http")
    def client(self, timeout: float) -> tuple[Client, httpx2.AsyncClient | None]:
        """A client of the server whose requests wait ``timeout`` seconds for an answer, and the
        HTTP client it was given (the mcp package closes only the ones it makes)."""
        if self.url:
            if not self.headers:
                return Client(self.url, read_timeout_seconds=timeout), None
            http = httpx2.AsyncClient(
                headers=dict(self.headers), timeout=httpx2.Timeout(30.0, read=max(HTTP_READ_SECONDS, timeout))
            )
            return Client(
                streamable_http_client(self.url, http_client=http), read_timeout_seconds=timeout
            ), http
        params = StdioServerParameters(
            command=self.command[0],
            args=list(self.command[1:]),
            # Added to the few variables the mcp package passes on (HOME, PATH, ...): a worker's
            # own environment (its database URL, its API keys) is not the server's business.
            env=dict(self.env),
            cwd=self.cwd,
        )
        return Client(params, read_timeout_seconds=timeout), None


class _Loop:
    """An asyncio event loop on a daemon thread, started on first use (and again in a forked child,
    which has the parent's object but not its thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0

    def run(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                self._loop = asyncio.new_event_loop()
                self._pid = os.getpid()
                threading.Thread(target=self._loop.run_forever, name="chamvi-mcp", daemon=True).start()
            loop = self._loop
        return asyncio.run_coroutine_threadsafe(coroutine, loop)


_loop = _Loop()
_sessions: dict[tuple[Target, float, float], Session] = {}
_sessions_lock = threading.Lock()


def session_for(target: Target, timeout: float, connect_timeout: float) -> Session:
    """This process's session with ``target`` (made on first use)."""
    key = (target, timeout, connect_timeout)
    with _sessions_lock:
        session = _sessions.get(key)
        if session is None:
            session = _sessions[key] = Session(target, timeout, connect_timeout)
        return session


class Session:
    """The kept session to one server. Thread-safe: any thread of the process may call."""

    def __init__(self, target: Target, timeout: float, connect_timeout: float) -> None:
        self.target = target
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._client: Client | None = None
        self._closed: asyncio.Event | None = None
        self._pid = 0

    def list_tools(self) -> list[dict[str, Any]]:
        """Every tool the server lists, each as ``name``, ``description``, ``input_schema``."""

        async def listing(client: Client) -> list[dict[str, Any]]:
            tools: list[dict[str, Any]] = []
            cursor: str | None = None
            while True:
                page = await client.list_tools(cursor=cursor)
                tools.extend(
                    {"name": t.name, "description": t.description or "", "input_schema": t.input_schema}
                    for t in page.tools
                )
                cursor = page.next_cursor
                if not cursor:
                    return tools

        return cast("list[dict[str, Any]]", self._on_session(listing))

    def call_tool(self, name: str, arguments: dict[str, Any], meta: dict[str, Any] | None) -> CallToolResult:
        async def call(client: Client) -> CallToolResult:
            return await client.call_tool(name, arguments, meta=cast("RequestParamsMeta | None", meta))

        return cast(CallToolResult, self._on_session(call))

    @sensitive_variables("client")
    def _on_session(self, work: Any) -> Any:
        client = self._connected()
        try:
            # The session's own read timeout ends the request; this one only guards against a
            # loop that does not answer at all.
            return _loop.run(work(client)).result(self.timeout + self.connect_timeout)
        except mcp.MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self._drop(client)
                raise Unreachable(f"the connection closed: {exc.message}") from None
            if exc.code == mcp.types.REQUEST_TIMEOUT:
                raise Unreachable(f"no answer within {self.timeout:g} s") from None
            raise Refused(f"{exc.message} (JSON-RPC error {exc.code})") from None
        except concurrent.futures.TimeoutError:
            self._drop(client)
            raise Unreachable(f"no answer within {self.timeout:g} s") from None
        except Exception as exc:
            if not _transport(exc):
                # The answer was not what the protocol allows (a result that breaks the tool's
                # output schema, say): that call's error; the session serves the others.
                raise Refused(_reason(exc)) from None
            self._drop(client)
            raise Unreachable(_reason(exc)) from None

    def _connected(self) -> Client:
        with self._lock:
            if self._client is not None and self._pid == os.getpid():
                return self._client
            ready: concurrent.futures.Future[Client] = concurrent.futures.Future()
            _loop.run(self._serve(ready))
            try:
                client = ready.result(self.connect_timeout)
            except concurrent.futures.TimeoutError:
                ready.cancel()
                raise Unreachable(f"could not connect within {self.connect_timeout:g} s") from None
            except Exception as exc:
                raise Unreachable(f"could not connect: {_reason(exc)}") from None
            self._client, self._pid = client, os.getpid()
            return client

    @sensitive_variables("client", "entered")
    async def _serve(self, ready: concurrent.futures.Future[Client]) -> None:
        """Holds the session open: anyio wants a client entered and left by the same task."""
        closed = asyncio.Event()
        client, http = self.target.client(self.timeout)
        try:
            try:
                async with asyncio.timeout(self.connect_timeout):
                    entered = await client.__aenter__()
            except BaseException as exc:
                if not ready.done():
                    ready.set_exception(exc if isinstance(exc, Exception) else Unreachable("cancelled"))
                return
            if ready.cancelled() or ready.done():
                await entered.__aexit__(None, None, None)
                return
            self._closed = closed
            ready.set_result(entered)
            try:
                await closed.wait()
            finally:
                # A broken connection may fail to close: it is gone either way.
                with contextlib.suppress(BaseException):
                    await entered.__aexit__(None, None, None)
        finally:
            if http is not None:
                with contextlib.suppress(BaseException):
                    await http.aclose()

    def close(self) -> None:
        """End the session (a stdio server's process exits); the next call connects again."""
        with self._lock:
            client = self._client
        if client is not None:
            self._drop(client)

    def _drop(self, client: Client) -> None:
        with self._lock:
            if self._client is not client:
                return
            self._client = None
            closed = self._closed
        if closed is not None:
            _loop.run(_set(closed))


async def _set(event: asyncio.Event) -> None:
    event.set()


def _transport(exc: BaseException) -> bool:
    """Whether ``exc`` (or, for an exception group, any of its leaves) says the connection broke."""
    if isinstance(exc, BaseExceptionGroup):
        return any(_transport(inner) for inner in exc.exceptions)
    return isinstance(exc, TRANSPORT_ERRORS)


def _reason(exc: BaseException) -> str:
    """The first leaf of an exception group (anyio wraps what a transport raised)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return str(exc) or type(exc).__name__
