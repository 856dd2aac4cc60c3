"""DBOS: a workflow whose model calls and tool calls are steps (each step's output is recorded in
DBOS's system database on PostgreSQL before the workflow goes on). The model call is the same
streamed ``openai`` call as bare's. Workflows run one after another, called directly in this
process. Runs in its own venv (bench/compare/venvs.py)."""

from __future__ import annotations

import os
from typing import Any

from dbos import DBOS, DBOSConfig

from bench.compare import workload
from bench.compare.systems import openai_loop
from bench.compare.systems.driver import config, serve

_state: dict[str, Any] = {}


@DBOS.step()
def model_turn(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return openai_loop.model_turn(_state["openai"], _state["model"], messages)


@DBOS.step()
def run_tool(name: str, arguments: str, key: str) -> str:
    return openai_loop.run_tool(name, arguments, key)


@DBOS.workflow()
def support_run() -> str:
    return openai_loop.tool_loop(model_turn, run_tool, DBOS.workflow_id or "")


class Dbos:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.worker_pid = os.getpid()
        _state.update(openai=openai_loop.client(cfg["base_url"]), model=cfg["model"])
        dbos_config: DBOSConfig = {
            "name": "chamvi-bench",
            "system_database_url": cfg["dsn"],
            "log_level": "WARNING",
        }
        DBOS(config=dbos_config)
        DBOS.launch()
        self.answers: list[str] = []

    def run_batch(self, runs: int) -> dict[str, Any]:
        self.answers = [support_run() for _ in range(runs)]
        return {}

    def verify(self) -> None:
        wrong = [a for a in self.answers if a != workload.FINAL_TEXT]
        if wrong:
            raise AssertionError(f"{len(wrong)} runs ended with another answer: {wrong[0]!r}")

    def close(self) -> None:
        DBOS.destroy()
        _state["openai"].close()


if __name__ == "__main__":
    cfg = config()
    serve(Dbos(cfg), cfg)
