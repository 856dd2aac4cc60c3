"""The query of a websocket's URL (SPEC §8): ``?after=<seq>``, and on a thread socket ``resume``.

``resume=<run_id>:<seq>,<run_id>:<seq>,…`` (an extension of SPEC §8) gives a thread socket the seq
its client has of each run: one ``after`` cannot, since every run has seqs of its own. Without it a
reconnecting client would ask for every run from 0 and skip what it has, which goes wrong once the
server has lost a run's seqs (Redis lost its data, embedded mode's process restarted): the run is
then numbered from 1 again and everything up to the client's seq, ``run.end`` included, would be
skipped. With it, the replay rules of ``streaming/replay.py`` serve the client as a run socket's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs

from ..core.numbers import ascii_int
from ..core.storable import unstorable

# A client names at most the latest runs it shows, as many as a thread socket replays: each named run
# is one more replay to serve.
MAX_RESUME = 50
MAX_RUN_ID = 200


class BadQuery(ValueError):
    """A query the socket refuses: the message tells the client what a good one is."""


def query_of(scope: Mapping[str, Any]) -> dict[str, list[str]]:
    return parse_qs(scope.get("query_string", b"").decode("latin-1"))


def after_of(query: dict[str, list[str]]) -> int:
    """The seq to replay after (0 when the query names none)."""
    after = ascii_int(query.get("after", ["0"])[0])
    if after is None:
        raise BadQuery("after must be a seq: a number in ASCII digits")
    return after


def resume_of(query: dict[str, list[str]]) -> dict[str, int]:
    """Run id -> the seq the client has of it, from ``resume`` (none: empty)."""
    raw = query.get("resume", [""])[0]
    if not raw:
        return {}
    pairs = raw.split(",")
    if len(pairs) > MAX_RESUME:
        raise BadQuery(f"resume names at most {MAX_RESUME} runs")
    seqs: dict[str, int] = {}
    for pair in pairs:
        run_id, _, digits = pair.rpartition(":")
        seq = ascii_int(digits)
        if seq is None or not run_id or len(run_id) > MAX_RUN_ID or unstorable(run_id):
            raise BadQuery("resume must be run_id:seq pairs separated by commas")
        seqs[run_id] = max(seq, seqs.get(run_id, 0))
    return seqs
