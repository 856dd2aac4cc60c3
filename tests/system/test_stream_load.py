"""Many runs streaming at once through a real daphne, channels-redis and RQ workers (one worker process
per run, one websocket client per run): the channel layer drops what it cannot hold, and every
client must still get each event of its run exactly once, ``run.end`` included."""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from chamvi_runs import start_run
from chamvi_runs.core.states import TERMINAL
from chamvi_runs.models import Run, Step
from tests.support.helpers import events, make_user, session_cookie
from tests.support.processes import WebProcess, WorkerProcess, wait_for, worker_env
from tests.support.scripted_server import Reply, delay, finish, text, usage
from tests.support.ws_client import Socket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

# Like a real model: a 4-character chunk every 20 ms; 400 characters take 2 s at the least.
CHUNK, PACE, LENGTH = 4, 0.02, 400
DROPS_KEY = "chamvi:stream:drops"


def answer(tag: str) -> str:
    words = f"Answer for {tag}: " + " ".join(f"word{n}" for n in range(LENGTH))
    return words[:LENGTH]


class PacedModel:
    """Answers each run with its own paced text, once every run's model call has arrived, so that
    all of them stream at the same time."""

    def __init__(self, runs: int) -> None:
        self.barrier = threading.Barrier(runs, timeout=120)

    def reply(self, body: dict[str, Any]) -> Reply:
        tag = next(
            json.loads(m["content"][0]["text"] if isinstance(m["content"], list) else m["content"])["payload"]
            for m in body["messages"]
            if m["role"] == "user"
        )["tag"]
        self.barrier.wait()
        content = answer(tag)
        chunks = [content[n : n + CHUNK] for n in range(0, len(content), CHUNK)]
        return Reply(
            *(e for chunk in chunks for e in (delay(PACE), text(chunk))), finish("stop"), usage(9, 9)
        )


@dataclass
class Stream:
    run_id: str
    received: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ended(self) -> bool:
        return any(e.get("type") == "run.end" for e in self.received)


async def follow(socket: Socket, stream: Stream, patience: float) -> None:
    """Read until run.end, or until nothing has come for ``patience`` seconds once the run has begun
    (the layer lost the rest); before that, as long as the workers take to start."""
    while not stream.ended:
        try:
            stream.received.append(await socket.receive(patience if stream.received else 180))
        except (TimeoutError, AssertionError):
            return


def spawn(workers: list[WorkerProcess], count: int, env: dict[str, str]) -> None:
    workers.extend(WorkerProcess(env) for _ in range(count))
    wait_for(lambda: all(w.ready() for w in workers), 150, lambda: workers[-1].output()[-2000:])


@pytest.mark.parametrize("runs", [8, 16, 32])
def test_concurrent_streams_lose_nothing_and_duplicate_nothing(server, redis, runs, capsys):
    owner = make_user("owner")
    model = PacedModel(runs)
    server.respond("m-basic", model.reply)
    env = worker_env(server.base_url)
    web = WebProcess(env)
    workers: list[WorkerProcess] = []
    try:
        cookie = session_cookie(owner)
        tags = [secrets.token_hex(4) for _ in range(runs)]
        ids = [start_run("basic", {"tag": tag}, created_by=owner).pk for tag in tags]
        streams = [Stream(run_id) for run_id in ids]
        slow = Stream(ids[0])

        async def scenario() -> bool:
            # The pages open their sockets first, as a chat page does before its run starts: daphne
            # drops a socket its application has not accepted within 5 s, and 33 handshakes while 32
            # workers start up on 2 cores may take longer.
            paths = [f"/ws/chamvi/runs/{run_id}/?after=0" for run_id in [*ids, ids[0]]]
            sockets = await asyncio.gather(*(Socket.open(web.port, path, cookie) for path in paths))
            # A client that stops reading (a stalled tab): its run must not wait for it.
            sockets[-1].pause()
            following = asyncio.gather(*(follow(s, st, 20) for s, st in zip(sockets, streams, strict=False)))
            await asyncio.to_thread(spawn, workers, runs, env)
            await following
            settled_while_stalled = await asyncio.to_thread(_wait_settled, ids, workers[0])
            sockets[-1].resume()
            await follow(sockets[-1], slow, 20)
            for socket in sockets:
                await socket.close()
            return settled_while_stalled

        settled_while_stalled = async_to_sync(scenario)()
    finally:
        for worker in workers:
            worker.stop()
        web.stop()

    lost = duplicated = unended = wrong_text = 0
    for stream in [*streams, slow]:
        expected = [e["seq"] for e in events(stream.run_id)]
        seqs = [e["seq"] for e in stream.received if "seq" in e]
        lost += len(set(expected) - set(seqs))
        duplicated += len(seqs) - len(set(seqs))
        unended += not stream.ended
        run = Run.objects.get(pk=stream.run_id)
        tag = run.trigger["payload"]["tag"]
        stored = Step.objects.get(run=run, kind="llm").output["text"]
        texts = "".join(e["text"] for e in stream.received if e.get("type") == "delta")
        wrong_text += not (texts == stored == answer(tag))
    repaired = {k.decode(): int(v) for k, v in redis.hgetall(DROPS_KEY).items()}
    with capsys.disabled():
        print(
            f"\n[stream-load] runs={runs} clients={runs + 1} events="
            f"{sum(len(s.received) for s in streams)} lost={lost} duplicated={duplicated} "
            f"without_run_end={unended} wrong_text={wrong_text} repaired={repaired}"
        )
    assert not model.barrier.broken, "the model calls did not all stream at once"
    assert (lost, duplicated, unended, wrong_text) == (0, 0, 0, 0)
    assert settled_while_stalled, "the run waited for a client that did not read"
    assert all(Run.objects.get(pk=i).status == "completed" for i in ids)


def _wait_settled(ids: list[str], worker: WorkerProcess) -> bool:
    """Wait until every run has settled; whether the first one completed."""
    from django.db import connection

    try:
        wait_for(
            lambda: (
                not Run.objects.filter(pk__in=ids).exclude(status__in=[s.value for s in TERMINAL]).exists()
            ),
            120,
            lambda: worker.output()[-2000:],
        )
        return Run.objects.filter(pk=ids[0], status="completed").exists()
    finally:
        connection.close()
