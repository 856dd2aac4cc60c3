"""The scripted model of the peer comparison, in a process of its own (bench/common/scripted_model.py)
that serves until its stdin closes.

    .venv/bin/python -m bench.compare.workload_model   # prints {"base_url": ..., "pid": ...}

It answers every request from the history it carries (``bench.compare.workload.turn_for``): model
``bench-instant`` sends its chunks back to back, ``bench-paced`` waits 20 ms before every chunk, as
a real model streams.
"""

from __future__ import annotations

import json
import os
from typing import Any

from bench.common.scripted_model import serve
from bench.compare import workload
from tests.support.scripted_server import Event, Reply, delay, finish, text, tool_call, usage


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


if __name__ == "__main__":
    serve(
        {
            workload.MODELS["instant"]: lambda body: reply_for(body, paced=False),
            workload.MODELS["paced"]: lambda body: reply_for(body, paced=True),
        }
    )
