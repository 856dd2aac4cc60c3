"""The bench's data: realistic runs bulk-inserted (five steps each, a checkpoint with a history of a
few KB, wait points, steering inputs, effect records, threads, artifacts with files in MEDIA_ROOT),
then most of them aged past 30 days in SQL."""

from __future__ import annotations

import argparse
import random
import string
from datetime import timedelta
from typing import Any

# Of every 100 runs: their status. Terminal ones dominate, as in any deployment that keeps history.
STATUSES = ["completed"] * 80 + ["failed"] * 8 + ["cancelled"] * 7 + ["waiting"] * 2 + ["running"] * 2
STATUSES += ["queued"]


class Words:
    """Text that compresses like prose (a vocabulary of made-up words), not like one repeated byte."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.vocabulary = [
            "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 10))) for _ in range(3000)
        ]

    def __call__(self, size: int) -> str:
        words: list[str] = []
        length = 0
        while length < size:
            word = self.rng.choice(self.vocabulary)
            words.append(word)
            length += len(word) + 1
        return " ".join(words)


def build(args: argparse.Namespace) -> dict[str, int]:
    """Insert the runs and their rows; returns counts of what was made."""
    from django.core.files.base import ContentFile
    from django.core.files.storage import default_storage
    from django.utils import timezone

    from chamvi_runs.models import Artifact, Checkpoint, EffectRecord, Run, RunInput, Step, Thread, WaitPoint

    rng = random.Random(args.seed)
    words = Words(rng)
    now = timezone.now()

    artifacts = []
    for i in range(args.artifacts):
        name = default_storage.save(
            f"chamvi_artifacts/bench/a{i}.bin", ContentFile(rng.randbytes(rng.randint(8, 64) * 1024))
        )
        artifacts.append(
            Artifact(
                filename=f"a{i}.bin",
                media_type="application/octet-stream",
                size=default_storage.size(name),
                file=name,
            )
        )
    Artifact.objects.bulk_create(artifacts, batch_size=1000)
    # Two thirds are attached to runs, the rest were uploaded and never used.
    attachable = artifacts[: len(artifacts) * 2 // 3]

    runs, steps, checkpoints, waitpoints, inputs, effects, threads = [], [], [], [], [], [], []
    position = 0
    while position < args.runs:
        thread = None
        size = 1
        if rng.random() < 0.3:  # a conversation of 3 to 6 runs
            thread = f"thr-{position}"
            size = rng.randint(3, 6)
            threads.append(Thread(name=thread))
        for _ in range(min(size, args.runs - position)):
            position += 1
            status = rng.choice(STATUSES)
            attached = [rng.choice(attachable)] if attachable and rng.random() < 0.05 else []
            created = now - timedelta(seconds=args.runs - position)
            run = Run(
                agent="support",
                status=status,
                trigger={
                    "id": None,
                    "source": "api",
                    "trigger": "http",
                    "payload": {"title": words(60), "body": words(rng.randint(200, 600))},
                    "keys": {"customer": f"c-{rng.randint(1, 500)}"},
                    "thread": thread,
                    "receivedAt": created.isoformat(),
                    "attachments": [
                        {"id": a.pk, "filename": a.filename, "media_type": a.media_type} for a in attached
                    ],
                },
                thread=thread,
                output=words(300) if status == "completed" else None,
                error_code="model_error" if status == "failed" else "",
                input_tokens=rng.randint(500, 5000),
                output_tokens=rng.randint(50, 800),
                model_calls=3,
                attempt=1,
                created_at=created,
                started_at=None if status == "queued" else created,
                finished_at=created + timedelta(seconds=20)
                if status in ("completed", "failed", "cancelled")
                else None,
            )
            runs.append(run)
            if status == "queued":
                continue
            history: list[dict[str, Any]] = [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": words(rng.randint(800, 2400))}]
                    + [
                        {
                            "type": "file",
                            "file": {"file_data": f"chamvi-artifact:{a.pk}", "filename": a.filename},
                        }
                        for a in attached
                    ],
                }
            ]
            for index in range(5):
                kind = "llm" if index % 2 == 0 else "tool"
                if kind == "llm":
                    text = words(rng.randint(300, 900))
                    calls = (
                        []
                        if index == 4
                        else [
                            {
                                "id": f"call_{index}",
                                "type": "function",
                                "function": {"name": "lookup_order", "arguments": '{"order_id": "o-1"}'},
                            }
                        ]
                    )
                    step_input: Any = {"messages": len(history) + 1, "inputs": []}
                    step_output: Any = {
                        "text": text,
                        "reasoning": "",
                        "tool_calls": calls,
                        "finish_reason": "tool_calls" if calls else "stop",
                        "usage": {"input_tokens": 900, "output_tokens": 120},
                    }
                    history.append(
                        {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}
                    )
                else:
                    step_input = {"order_id": "o-1"}
                    step_output = {"order": words(rng.randint(200, 800))}
                    history.append(
                        {"role": "tool", "tool_call_id": f"call_{index - 1}", "content": str(step_output)}
                    )
                steps.append(
                    Step(
                        run=run,
                        index=index,
                        kind=kind,
                        name="gpt-4o-mini" if kind == "llm" else "lookup_order",
                        input=step_input,
                        output=step_output,
                        attempt=1,
                        started_at=created,
                        finished_at=created,
                    )
                )
            checkpoints.append(Checkpoint(run=run, step_index=4, messages=history, finish_reason="stop"))
            if status == "waiting" or rng.random() < 0.1:
                waitpoints.append(
                    WaitPoint(
                        run=run,
                        step_index=2,
                        model_step=0,
                        call_position=0,
                        tool_call_id="call_0",
                        tool_name="issue_refund",
                        input={"order_id": "o-1", "amount_cents": 500},
                        decision=None if status == "waiting" else "approved",
                        decided_at=None if status == "waiting" else created,
                        reason="" if status == "waiting" else words(40),
                    )
                )
            if rng.random() < 0.1:
                inputs.append(RunInput(run=run, payload=words(rng.randint(40, 200)), consumed_step=2))
            if rng.random() < 0.15:
                effects.append(
                    EffectRecord(
                        run=run,
                        key=f"{run.pk}:0:0",
                        tool_name="issue_refund",
                        input={"order_id": "o-1", "amount_cents": 500},
                        output={"refund_id": f"re_{rng.randint(1, 10**9)}", "status": "succeeded"},
                    )
                )
    Thread.objects.bulk_create(threads, batch_size=2000)
    Run.objects.bulk_create(runs, batch_size=2000)
    for model, rows in (
        (Step, steps),
        (Checkpoint, checkpoints),
        (WaitPoint, waitpoints),
        (RunInput, inputs),
        (EffectRecord, effects),
    ):
        model.objects.bulk_create(rows, batch_size=2000)
    return {
        "Run": len(runs),
        "Step": len(steps),
        "Checkpoint": len(checkpoints),
        "WaitPoint": len(waitpoints),
        "RunInput": len(inputs),
        "EffectRecord": len(effects),
        "Thread": len(threads),
        "Artifact": len(artifacts),
    }


def age(old_percent: int) -> None:
    """Move most runs (the runs of a thread together, so its order stays) and artifacts 31 to 180
    days into the past, and every thread row to its oldest run."""
    from django.db import connection

    with connection.cursor() as cursor:
        shift = "(31 + abs(hashtext(coalesce(thread, id))) %% 150) * interval '1 day'"
        cursor.execute(
            f"""
            UPDATE chamvi_runs_run SET
                created_at = created_at - {shift}, finished_at = finished_at - {shift},
                started_at = started_at - {shift}
            WHERE abs(hashtext(coalesce(thread, id) || ':old')) %% 100 < %s
            """,
            [old_percent],
        )
        cursor.execute(
            "UPDATE chamvi_runs_artifact "
            "SET created_at = created_at - (31 + abs(hashtext(id)) % 150) * interval '1 day'"
        )
        cursor.execute(
            """
            UPDATE chamvi_runs_thread t SET created_at = r.first FROM (
                SELECT thread, min(created_at) AS first FROM chamvi_runs_run GROUP BY thread
            ) r WHERE r.thread = t.name
            """
        )
        cursor.execute("ANALYZE")
