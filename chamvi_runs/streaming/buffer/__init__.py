"""The replay buffer: a run's events keyed by ``seq``, for clients that reconnect.

``seq`` starts at 1 and grows by 1 per run across every process: it is allocated in Redis when the
queue's Redis is in use, else in this process (embedded mode, one process by definition). Events are
kept by seq (a sorted set scored by seq in Redis), so that "every event after seq N" is a range
query, whatever expired or was trimmed before it:

- Lifetime: the buffer expires ``buffer_ttl()`` after its last event: while the run is active, as
  long as the run can wait (the site's approval TTL, or its open wait point's own expiry) plus
  ``STREAM_BUFFER_SECONDS``; from ``run.end`` on, ``STREAM_BUFFER_SECONDS``. The seq counter lives
  ``SEQ_TTL``: a run that resumes after its buffer expired goes on numbering, never reuses a seq.
- Caps: at most ``max_events`` events and ``max_bytes`` bytes of their JSON per run (a log's
  arguments, ``BUFFER_EVENTS`` and ``BUFFER_BYTES`` by default); the oldest are dropped first,
  never the newest.
- Regions: when a client asks for events the buffer no longer holds, ``replay`` rebuilds the run
  from its stored steps and, for an active run, stores that rebuild here as a *region* numbered
  after the counter (the rules are in ``replay.py``). Only the run's own counter numbers a region:
  a seq a client names never moves it. A region remembers what it covers (its last
  stored step, its ``run.start`` and open ``run.waiting``): an event it covers that the executing
  process records later (events are recorded a moment after their step is saved) is dropped,
  neither buffered nor sent, so no client gets it twice.

The rules are ``rules.py``; the stores ``memory.py`` (embedded mode) and ``redis_log.py`` with its
scripts in ``lua/``; ``factory.py`` picks the one this process uses. Each module imports only the
ones below it, never this package.
"""

from .factory import event_log
from .memory import MemoryEventLog
from .redis_log import RedisEventLog
from .rules import (
    BUFFER_BYTES,
    BUFFER_EVENTS,
    MARKER,
    MAX_SEQ,
    SEQ_TTL,
    Rebuild,
    Window,
    buffer_ttl,
    carried,
    cover,
    holds_waiting,
    region,
    waiting_tokens,
)

__all__ = [
    "BUFFER_BYTES",
    "BUFFER_EVENTS",
    "MARKER",
    "MAX_SEQ",
    "SEQ_TTL",
    "MemoryEventLog",
    "Rebuild",
    "RedisEventLog",
    "Window",
    "buffer_ttl",
    "carried",
    "cover",
    "event_log",
    "holds_waiting",
    "region",
    "waiting_tokens",
]
