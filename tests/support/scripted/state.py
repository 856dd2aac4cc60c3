"""State shared by the server object and its request threads: scripted replies and recorded requests."""

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.support.scripted.events import Reply


@dataclass
class ServerState:
    queues: dict[str, deque[Reply]] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)
    active: int = 0
    idle: threading.Condition = field(default_factory=threading.Condition)
    counter: int = 0
    responders: dict[str, Callable[[dict[str, Any]], Reply]] = field(default_factory=dict)
