"""``ScriptedServer``: starting and stopping the HTTP server, scripting it, reading what it recorded."""

import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from tests.support.scripted.events import Reply
from tests.support.scripted.handler import ScriptedHandler, ScriptedHTTPServer
from tests.support.scripted.state import ServerState


class ScriptedServer:
    """Threaded scripted Chat Completions and Responses API server on ``127.0.0.1:<free port>``.

    Use as a context manager (or call ``start()``/``stop()``). ``script()`` may be called
    before or while the server runs.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._state = ServerState()
        self._host = host
        self._port = port
        self._httpd: ScriptedHTTPServer | None = None
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
        httpd = ScriptedHTTPServer((self._host, self._port), ScriptedHandler)
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
        """Parsed JSON bodies of all requests, in arrival order (a copy): a Responses request as the
        Chat Completions request it stands for, its own body under ``responses``."""
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
