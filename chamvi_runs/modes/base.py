"""What a deployment mode owns: how a doorbell rings, which runs have a job waiting, which replay
buffer this process uses, and where stream repairs are counted for every process to see.

Dispatch and streaming are independent layers that both ask the mode, so the mode sits below them
and imports neither. What only they have, they lend at the call: the doorbell its site's stamp, the
buffer its two stores (``EventLogs``); the mode says which is used.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from redis import Redis

L = TypeVar("L", covariant=True)


class EventLogs(Protocol[L]):
    """The replay buffer's stores, as ``streaming.buffer`` makes them."""

    def in_redis(self, queue: str, redis: Redis) -> L:
        """The store every process of the site shares: in the Redis of ``queue``."""

    def in_memory(self) -> L:
        """This process's own store."""


class Mode(ABC):
    """One per setting of ``EXECUTOR`` (and ``QUEUE``), built by ``modes.mode()``; ``str()`` says
    what executes runs, for messages."""

    @abstractmethod
    def ring(self, run_id: str, stamp: Callable[[], dict[str, str]]) -> None:
        """Tell whoever executes runs that ``run_id`` is ready. ``stamp``: the meta a queued job
        carries besides the run id (the site that rang), asked only when a job is queued."""

    @abstractmethod
    def waiting_jobs(self) -> set[str]:
        """Ids of the runs that have a job waiting, so the janitor rings no doorbell twice."""

    @abstractmethod
    def event_log(self, logs: EventLogs[L]) -> L:
        """The replay buffer this process reads and writes."""

    @abstractmethod
    def count_drops(self, key: str, kind: str, count: int) -> None:
        """Add ``count`` repairs of ``kind`` to the counters in hash ``key`` that every process of
        the site reads; a count that fails is logged, never raised (it is for operators)."""
