"""The model of the concurrency bench: every chat completion waits ``think`` seconds before its
first chunk, then streams the same short answer. It runs in a process of its own
(bench/common/scripted_model.py) so that its 200 sleeping streams share no GIL with the driver's
sampling.

    python -m bench.concurrency.thinking_model --think 10 --chunks 20 --gap 0.01
"""

from __future__ import annotations

import argparse
from typing import Any

from bench.common.scripted_model import serve
from tests.support.scripted_server import Reply, delay, finish, text, usage

MODEL = "m-basic"

WARMUP = "warmup"
"""A run whose payload holds this word gets its answer without thinking: it only warms a worker up
(imports, the client's first connection) before the measured batches."""


def answer_chunks(chunks: int) -> list[str]:
    """The answer's text chunks: numbered, so that a lost or repeated chunk shows in the stored text."""
    return [f"part{n:02d} " for n in range(chunks)]


def answer(chunks: int) -> str:
    return "".join(answer_chunks(chunks))


def reply(think: float, chunks: int, gap: float) -> Reply:
    events: list[Any] = [delay(think)]
    for piece in answer_chunks(chunks):
        events.append(text(piece))
        if gap:
            events.append(delay(gap))
    return Reply(*events, finish("stop"), usage(20, chunks))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--think", type=float, default=10.0)
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--gap", type=float, default=0.01, help="seconds between answer chunks")
    args = parser.parse_args()

    def respond(body: dict[str, Any]) -> Reply:
        warm = WARMUP in str(body.get("messages"))
        return reply(0 if warm else args.think, args.chunks, args.gap)

    serve({MODEL: respond})


if __name__ == "__main__":
    main()
