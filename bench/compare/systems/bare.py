"""Ceiling 1: the same streamed model calls and tools with the bare ``openai`` client, nothing stored.
Runs one after another in this process."""

from __future__ import annotations

import os
import uuid
from typing import Any

from bench.compare import workload
from bench.compare.systems import openai_loop
from bench.compare.systems.driver import config, serve


class Bare:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.worker_pid = os.getpid()
        self.model = cfg["model"]
        self.openai = openai_loop.client(cfg["base_url"])
        self.answers: list[str] = []

    def run_batch(self, runs: int) -> dict[str, Any]:
        self.answers = []
        for _ in range(runs):
            self.answers.append(
                openai_loop.tool_loop(
                    lambda messages: openai_loop.model_turn(self.openai, self.model, messages),
                    openai_loop.run_tool,
                    uuid.uuid4().hex,
                )
            )
        return {}

    def verify(self) -> None:
        wrong = [a for a in self.answers if a != workload.FINAL_TEXT]
        if wrong:
            raise AssertionError(f"{len(wrong)} runs ended with another answer: {wrong[0]!r}")

    def close(self) -> None:
        self.openai.close()


if __name__ == "__main__":
    cfg = config()
    serve(Bare(cfg), cfg)
