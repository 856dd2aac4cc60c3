"""The only module that imports ``mcp``: one kept session per MCP server and process.

Connecting costs far more than calling (a stdio server is a process to start, about half a second;
a call on a kept session takes milliseconds), so each process keeps one session per server, in an
event loop of its own on a daemon thread, and every execution thread of the process calls through
it. A session whose connection closed (the server died or restarted) is dropped, and the next call
connects again: a server that is down costs each call at most ``connect_timeout``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import mcp
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, RequestParamsMeta

T = TypeVar("T")

CONNECTION_CLOSED = -32000


class Unreachable(Exception):
    """The server could not be reached, or did not answer in time: the call did not run there, or
    its outcome is unknown."""


class Refused(Exception):
    """The server answered the request with a JSON-RPC error (an unknown tool, invalid params)."""


@dataclass(frozen=True)
class Target:
    """Where a server is: a command (stdio) or a URL (streamable HTTP)."""

    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    url: str = ""
    headers: tuple[tuple[str, str], ...] = ()

    def client(self, timeout: float) -> Client:
        if self.url:
            return Client(
                self.url if not self.headers else _with_headers(self.url, dict(self.headers)),
                read_timeout_seconds=timeout,
            )
        params = StdioServerParameters(
            command=self.command[0],
            args=list(self.command[1:]),
            # Added to the few variables the mcp package passes on (HOME, PATH, ...): a worker's
            # own environment (its database URL, its API keys) is not the server's business.
            env=dict(self.env),
            cwd=self.cwd,
        )
        return Client(params, read_timeout_seconds=timeout)


def _with_headers(url: str, headers: dict[str, str]) -> Any:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    return streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers, timeout=30))


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


class Session:
    """The kept session to one server. Thread-safe: any thread of the process may call."""

    def __init__(self, target: Target, connect_timeout: float) -> None:
        self.target = target
        self.connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._client: Client | None = None
        self._closed: asyncio.Event | None = None
        self._pid = 0

    def list_tools(self, timeout: float) -> list[dict[str, Any]]:
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

        return cast("list[dict[str, Any]]", self._on_session(listing, timeout))

    def call_tool(
        self, name: str, arguments: dict[str, Any], meta: dict[str, Any] | None, timeout: float
    ) -> CallToolResult:
        async def call(client: Client) -> CallToolResult:
            return await client.call_tool(
                name, arguments, read_timeout_seconds=timeout, meta=cast("RequestParamsMeta | None", meta)
            )

        return cast(CallToolResult, self._on_session(call, timeout))

    def _on_session(self, work: Any, timeout: float) -> Any:
        client = self._connected()
        try:
            # The session's own read timeout ends the request; this one only guards against a
            # loop that does not answer at all.
            return _loop.run(work(client)).result(timeout + self.connect_timeout)
        except mcp.MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self._drop(client)
                raise Unreachable(f"the connection closed: {exc.message}") from None
            if exc.code == mcp.types.REQUEST_TIMEOUT:
                raise Unreachable(f"no answer within {timeout:g} s") from None
            raise Refused(f"{exc.message} (JSON-RPC error {exc.code})") from None
        except concurrent.futures.TimeoutError:
            self._drop(client)
            raise Unreachable(f"no answer within {timeout:g} s") from None
        except Exception as exc:
            # The transport failed (an HTTP error, a reset connection, a broken pipe): whatever
            # the session holds is suspect, and the next call connects again.
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

    async def _serve(self, ready: concurrent.futures.Future[Client]) -> None:
        """Holds the session open: anyio wants a client entered and left by the same task."""
        closed = asyncio.Event()
        try:
            async with asyncio.timeout(self.connect_timeout):
                client = await self.target.client(timeout=self.connect_timeout).__aenter__()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else Unreachable("cancelled"))
            return
        if ready.cancelled() or ready.done():
            await client.__aexit__(None, None, None)
            return
        self._closed = closed
        ready.set_result(client)
        try:
            await closed.wait()
        finally:
            # A broken connection may fail to close: it is gone either way.
            with contextlib.suppress(BaseException):
                await client.__aexit__(None, None, None)

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


def _reason(exc: BaseException) -> str:
    """The first leaf of an exception group (anyio wraps what a transport raised)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return str(exc) or type(exc).__name__
