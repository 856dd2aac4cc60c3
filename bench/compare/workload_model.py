"""The scripted OpenAI-compatible model of the bench, as a process of its own.

    .venv/bin/python bench/model_server.py   # prints {"base_url": ..., "pid": ...}; serves till stdin closes

It is tests/scripted_server.py's server, answering every request from the history it carries
(``bench.workload.turn_for``): model ``bench-instant`` sends its chunks back to back, ``bench-paced``
waits 20 ms before every chunk, as a real model streams.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import workload  # noqa: E402
from tests.scripted_server import Event, Reply, ScriptedServer, delay, finish, text, tool_call, usage  # noqa: E402


def reply_for(body: dict[str, Any], paced: bool) -> Reply:
    turn = workload.turn_for(body.get("messages") or [])
    events: list[Event] = [text(piece) for piece in workload.chunks(turn.text)]
    if turn.tool is not None:
        # A fresh id per request, as a real model mints one per call.
        call_id = f"call_{os.urandom(6).hex()}"
        events.append(tool_call(call_id, turn.tool, json.dumps(turn.arguments)))
    events.append(finish("stop" if turn.tool is None else "tool_calls"))
    if paced:
        events = [paced_event for event in events for paced_event in (delay(workload.PACED_DELAY), event)]
    events.append(usage(turn.prompt_tokens, turn.completion_tokens))
    return Reply(*events)


def main() -> None:
    with ScriptedServer() as server:
        server.respond(workload.MODELS["instant"], lambda body: reply_for(body, paced=False))
        server.respond(workload.MODELS["paced"], lambda body: reply_for(body, paced=True))
        print(json.dumps({"base_url": server.base_url, "pid": os.getpid()}), flush=True)
        # The parent closes our stdin to stop us; it also ends us should the parent die.
        sys.stdin.read()


if __name__ == "__main__":
    main()
