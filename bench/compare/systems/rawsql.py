"""Ceiling 2: the write pattern of a durable tool loop in plain psycopg, with no model and no tools.

Per run: the run row is inserted (one transaction) and claimed with a new fencing token (one), then
each of the 4 model steps is one transaction: a fenced UPDATE of the run row (its usage; the last
one settles it), a multi-row INSERT of the step rows (the model step and its tool step), and an
UPSERT of the run's one checkpoint row holding the whole message history. 6 commits per run. The
histories are the ones the other systems build (``workload.transcript``).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from bench.compare import workload
from bench.compare.systems.driver import config, serve

SCHEMA = """
CREATE TABLE IF NOT EXISTS bench_run (
    id uuid PRIMARY KEY, agent text NOT NULL, status text NOT NULL, lease_token bigint NOT NULL DEFAULT 0,
    claim_owner text, model_calls integer NOT NULL DEFAULT 0, input_tokens integer NOT NULL DEFAULT 0,
    output_tokens integer NOT NULL DEFAULT 0, payload jsonb NOT NULL, output text,
    created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS bench_step (
    id bigserial PRIMARY KEY, run_id uuid NOT NULL REFERENCES bench_run, seq integer NOT NULL,
    kind text NOT NULL, name text, input jsonb, output jsonb, created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (run_id, seq)
);
CREATE TABLE IF NOT EXISTS bench_checkpoint (
    run_id uuid PRIMARY KEY REFERENCES bench_run, step_seq integer NOT NULL, messages jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
"""


class RawSQL:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.worker_pid = os.getpid()
        self.conn = psycopg.connect(cfg["dsn"], autocommit=True)
        self.conn.execute(SCHEMA)
        self.run_ids: list[str] = []

    def run_batch(self, runs: int) -> dict[str, Any]:
        self.run_ids = [self._run() for _ in range(runs)]
        return {"own_commits": 1}  # verify's read

    def _run(self) -> str:
        run_id = str(uuid.uuid4())
        conn = self.conn
        conn.execute(
            "INSERT INTO bench_run (id, agent, status, payload) VALUES (%s, 'support', 'queued', %s)",
            [run_id, Jsonb({"message": workload.USER_MESSAGE})],
        )
        token = conn.execute(
            "UPDATE bench_run SET status = 'running', lease_token = lease_token + 1, claim_owner = %s,"
            " updated_at = now() WHERE id = %s AND status = 'queued' RETURNING lease_token",
            [f"rawsql-{self.worker_pid}", run_id],
        ).fetchone()[0]  # type: ignore[index]
        seq = 0
        histories = workload.transcript(run_id)
        for number, (turn, history) in enumerate(zip(workload.TURNS, histories, strict=True)):
            last = number == len(workload.TURNS) - 1
            assistant = history[-1] if last else history[-2]
            steps = [(run_id, seq + 1, "llm", None, None, Jsonb(assistant))]
            if not last:
                tool_result = history[-1]
                steps.append((run_id, seq + 2, "tool", turn.tool, Jsonb(turn.arguments), Jsonb(tool_result)))
            with conn.transaction():
                updated = conn.execute(
                    "UPDATE bench_run SET model_calls = model_calls + 1, input_tokens = input_tokens + %s,"
                    " output_tokens = output_tokens + %s, status = %s, output = %s, updated_at = now()"
                    " WHERE id = %s AND lease_token = %s",
                    [
                        turn.prompt_tokens,
                        turn.completion_tokens,
                        "completed" if last else "running",
                        turn.text if last else None,
                        run_id,
                        token,
                    ],
                ).rowcount
                if updated != 1:
                    raise RuntimeError("lost the lease")
                placeholders = ", ".join(["(%s, %s, %s, %s, %s, %s)"] * len(steps))
                conn.execute(
                    f"INSERT INTO bench_step (run_id, seq, kind, name, input, output) VALUES {placeholders}",
                    [value for step in steps for value in step],
                )
                seq += len(steps)
                conn.execute(
                    "INSERT INTO bench_checkpoint (run_id, step_seq, messages) VALUES (%s, %s, %s)"
                    " ON CONFLICT (run_id) DO UPDATE SET step_seq = EXCLUDED.step_seq,"
                    " messages = EXCLUDED.messages, updated_at = now()",
                    [run_id, seq, Jsonb(history)],
                )
        return run_id

    def verify(self) -> None:
        done = self.conn.execute(
            "SELECT count(*) FROM bench_run"
            " WHERE id = ANY(%s::uuid[]) AND status = 'completed' AND output = %s",
            [self.run_ids, workload.FINAL_TEXT],
        ).fetchone()[0]  # type: ignore[index]
        if done != len(self.run_ids):
            raise AssertionError(f"{len(self.run_ids) - done} runs did not complete")

    def close(self) -> None:
        self.conn.close()


if __name__ == "__main__":
    cfg = config()
    serve(RawSQL(cfg), cfg)
