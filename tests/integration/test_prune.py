"""``manage.py chamvi_prune``: retention of settled runs, threads' histories and artifacts, against
the real PostgreSQL. Ages are moved in SQL (``_age``), never waited out."""

from __future__ import annotations

import io
import re
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.files.storage import default_storage
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone

from chamvi_runs import approve, send_input, start_run
from chamvi_runs.models import (
    Artifact,
    Checkpoint,
    EffectRecord,
    Run,
    RunInput,
    Step,
    Thread,
    WaitPoint,
)
from chamvi_runs.runtime.artifacts import save_artifact
from chamvi_runs.store import pruning, references
from tests.support.helpers import execute
from tests.support.scripted_server import Reply, finish, text, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

CHILDREN = (Step, Checkpoint, WaitPoint, RunInput, EffectRecord)


def prune(*args: str) -> str:
    out = io.StringIO()
    call_command("chamvi_prune", *args, stdout=out)
    return out.getvalue()


def table(output: str) -> dict[str, tuple[int, int]]:
    """The printed rows and bytes per model (``artifact files`` and ``total`` included)."""
    figures = {}
    for line in output.splitlines():
        match = re.fullmatch(r"(\w+(?: files)?)\s+([\d,]+)\s+([\d,]+)(?: \(files\))?", line)
        if match:
            figures[match[1]] = (int(match[2].replace(",", "")), int(match[3].replace(",", "")))
    return figures


def _age(runs: Any, days: float) -> None:
    """Move the runs ``days`` into the past, in SQL, keeping their order."""
    delta = timedelta(days=days)
    Run.objects.filter(pk__in=[r.pk for r in runs]).update(
        created_at=F("created_at") - delta, finished_at=F("finished_at") - delta
    )


def _age_artifacts(artifacts: list[Artifact], days: float) -> None:
    Artifact.objects.filter(pk__in=[a.pk for a in artifacts]).update(created_at=Now() - timedelta(days=days))


def _run(status: str, *, thread: str | None = None, history: bool = True, **fields: Any) -> Run:
    """A run in ``status`` with an llm step and (``history``) a checkpoint, written directly: the
    shapes that prune reads, without an execution each."""
    now = timezone.now()
    settled = status in ("completed", "failed", "cancelled")
    run = Run.objects.create(
        agent="basic",
        status=status,
        trigger={"source": "api", "trigger": "api", "payload": "x", "thread": thread, "attachments": []},
        thread=thread,
        finished_at=now if settled else None,
        **fields,
    )
    Step.objects.create(
        run=run, index=0, kind="llm", name="m", input={}, output={"text": "hi"}, started_at=now
    )
    if history:
        Checkpoint.objects.create(run=run, step_index=0, messages=[{"role": "assistant", "content": "hi"}])
    return run


def _full_run(server: Any) -> Run:
    """A completed run with a row of every kind, through real executions: llm, tool and wait steps, a
    checkpoint, a decided wait point, a steering input and an effect record."""
    server.script(
        "m-approving",
        [
            Reply(
                tool_call("c1", "refund", '{"order_id": "o-1", "amount_cents": 500}'), finish("tool_calls")
            ),
            Reply(text("Refunded."), finish("stop")),
        ],
    )
    run = execute(start_run("approving", "refund o-1"))
    send_input(run.pk, "thanks")
    approve(WaitPoint.objects.get(run=run).approval_id)
    run = execute(run)
    assert run.status == "completed"
    for model in CHILDREN:
        assert model.objects.filter(run=run).exists(), model.__name__
    return run


def _everything() -> dict[str, list[Any]]:
    models = (Run, *CHILDREN, Thread, Artifact)
    return {m.__name__: sorted(m.objects.values_list("pk", flat=True)) for m in models}


def test_old_settled_runs_go_with_all_their_rows_and_live_or_recent_runs_stay(server):
    full = _full_run(server)
    steps = Step.objects.filter(run=full).count()
    failed, cancelled = _run("failed"), _run("cancelled", history=False)
    recent = _run("completed")
    live = [_run("queued", history=False), _run("running"), _run("waiting"), _run("interrupted")]
    _age([full, failed, cancelled, *live], days=40)
    _age([recent], days=29)

    output = prune("--older-than", "30d")

    assert not Run.objects.filter(pk__in=[full.pk, failed.pk, cancelled.pk]).exists()
    for model in CHILDREN:
        assert not model.objects.filter(run_id__in=[full.pk, failed.pk, cancelled.pk]).exists()
    assert set(Run.objects.values_list("pk", flat=True)) == {recent.pk, *(r.pk for r in live)}
    assert all(Step.objects.filter(run=r).exists() for r in [recent, *live])
    figures = table(output)
    assert figures["Run"][0] == 3
    assert figures["Step"][0] == steps + 2 and figures["Checkpoint"][0] == 2
    assert [figures[m][0] for m in ("WaitPoint", "RunInput", "EffectRecord")] == [1, 1, 1]
    assert all(figures[m][1] > 0 for m in ("Run", "Step", "Checkpoint", "WaitPoint", "RunInput"))
    row_bytes = sum(figures[m][1] for m in pruning.MODELS)
    assert figures["total"] == (sum(figures[m][0] for m in pruning.MODELS), row_bytes)
    assert re.search(r"1 batches of at most 500; longest [\d.]+ s; elapsed [\d.]+ s", output)


def test_status_limits_what_goes(server):
    completed, failed = _run("completed"), _run("failed")
    _age([completed, failed], days=40)
    prune("--older-than", "30d", "--status", "failed")
    assert list(Run.objects.values_list("pk", flat=True)) == [completed.pk]


def test_ages_are_read_in_days_hours_minutes_and_seconds():
    run = _run("completed")
    Run.objects.filter(pk=run.pk).update(finished_at=Now() - timedelta(hours=2))
    for age in ("1d", "3h", "121m"):
        prune("--older-than", age)
        assert Run.objects.filter(pk=run.pk).exists(), age
    prune("--older-than", "7100s")
    assert not Run.objects.filter(pk=run.pk).exists()


def test_a_settled_run_without_finished_at_is_aged_by_created_at():
    run = _run("cancelled", history=False)
    Run.objects.filter(pk=run.pk).update(finished_at=None, created_at=Now() - timedelta(days=40))
    prune("--older-than", "30d")
    assert not Run.objects.filter(pk=run.pk).exists()


def test_the_newest_settled_run_of_a_thread_stays_and_a_new_run_continues_from_it(server):
    server.script("m-basic", [Reply(text(f"answer {i}"), finish("stop")) for i in range(3)])
    first, second = (execute(start_run("basic", f"q{i}", thread="t-1")) for i in range(2))
    # The thread's newest settled run without a history (cancelled before it started) is no source.
    cancelled = _run("cancelled", thread="t-1", history=False)
    _age([first, second, cancelled], days=40)

    output = prune("--older-than", "30d")

    assert set(Run.objects.values_list("pk", flat=True)) == {second.pk}
    assert Thread.objects.filter(name="t-1").exists()
    assert "Kept 1 old runs that hold their thread's latest history" in output
    third = execute(start_run("basic", "q2", thread="t-1"))
    sent = server.requests_for("m-basic")[-1]["messages"]
    assert [m["content"] for m in sent if m["role"] == "assistant"] == ["answer 0", "answer 1"]
    assert third.status == "completed"


def test_with_threads_a_thread_idle_past_the_cutoff_goes_whole_and_a_live_one_keeps_its_history():
    idle = [_run("completed", thread="idle"), _run("failed", thread="idle")]
    busy = [_run("completed", thread="busy"), _run("waiting", thread="busy")]
    recent = [_run("completed", thread="recent"), _run("completed", thread="recent")]
    for name in ("idle", "busy", "recent", "empty", "new-empty"):
        Thread.objects.create(name=name)
    Thread.objects.exclude(name="new-empty").update(created_at=Now() - timedelta(days=50))
    _age([*idle, *busy, recent[0]], days=40)

    prune("--older-than", "30d")
    # Without --threads every thread keeps its newest history; an older run of a thread goes.
    assert list(Run.objects.filter(thread="idle").values_list("pk", flat=True)) == [idle[1].pk]
    assert list(Run.objects.filter(thread="recent").values_list("pk", flat=True)) == [recent[1].pk]
    assert Thread.objects.count() == 5

    output = prune("--older-than", "30d", "--threads")

    assert not Run.objects.filter(thread="idle").exists()
    assert set(Run.objects.filter(thread="busy").values_list("pk", flat=True)) == {busy[0].pk, busy[1].pk}
    assert list(Run.objects.filter(thread="recent").values_list("pk", flat=True)) == [recent[1].pk]
    assert set(Thread.objects.values_list("name", flat=True)) == {"busy", "recent", "new-empty"}
    assert table(output)["Thread"][0] == 2


def test_a_thread_with_runs_outside_status_keeps_its_history_with_threads():
    runs = [
        _run("completed", thread="mixed"),
        _run("failed", thread="mixed"),
        _run("completed", thread="mixed"),
    ]
    _age(runs, days=40)
    prune("--older-than", "30d", "--threads", "--status", "completed")
    # Not the whole thread may go: its newest completed run keeps the history.
    assert set(Run.objects.values_list("pk", flat=True)) == {runs[1].pk, runs[2].pk}


def test_each_creators_newest_history_of_a_thread_stays(django_user_model):
    alice = django_user_model.objects.create_user("alice")
    support = django_user_model.objects.create_user("support")
    runs = [
        _run("completed", thread="shared", created_by=alice),
        _run("completed", thread="shared", created_by=alice),
        _run("completed", thread="shared", created_by=support),
    ]
    _age(runs, days=40)
    prune("--older-than", "30d")
    # Alice, unable to view support's run, continues from her own newest one.
    assert set(Run.objects.values_list("pk", flat=True)) == {runs[1].pk, runs[2].pk}


@pytest.fixture
def media(settings: Any, tmp_path: Path) -> Path:
    settings.MEDIA_ROOT = str(tmp_path)
    return tmp_path


def test_a_referenced_artifact_stays_and_an_unreferenced_old_one_goes_with_its_file(server, media):
    kept_by_trigger, kept_by_history, orphaned, never_used, recent = (
        save_artifact(f"bytes {i}".encode(), f"f{i}.txt") for i in range(5)
    )
    server.script("m-basic", [Reply(text(f"seen {i}"), finish("stop")) for i in range(4)])
    queued = start_run("basic", "later", attachments=[kept_by_trigger])
    # The thread's newest run holds the first run's attachment in its history only.
    first = execute(start_run("basic", "look", thread="t-a", attachments=[kept_by_history]))
    newest = execute(start_run("basic", "and?", thread="t-a"))
    assert f"chamvi-artifact:{kept_by_history.pk}" in str(Checkpoint.objects.get(run=newest).messages)
    gone_run = execute(start_run("basic", "old", attachments=[orphaned]))
    # A run queued for 40 days (behind its concurrency key, say) still holds its attachment.
    _age([queued, first, newest, gone_run], days=40)
    _age_artifacts([kept_by_trigger, kept_by_history, orphaned, never_used], days=40)
    names = {a.pk: a.file.name for a in Artifact.objects.all()}

    output = prune("--older-than", "30d")

    assert set(Artifact.objects.values_list("pk", flat=True)) == {
        kept_by_trigger.pk,
        kept_by_history.pk,
        recent.pk,
    }
    for artifact in (kept_by_trigger, kept_by_history, recent):
        assert default_storage.exists(names[artifact.pk])
    for artifact in (orphaned, never_used):
        assert not default_storage.exists(names[artifact.pk])
    assert Run.objects.filter(pk=queued.pk).exists()
    figures = table(output)
    assert figures["Artifact"][0] == 2 and figures["Artifact"][1] > 0
    assert figures["artifact files"] == (2, len(b"bytes 2") + len(b"bytes 3"))
    assert execute(queued).status == "completed"  # its attachment is still there to read


def test_the_portable_reference_scan_finds_what_postgresql_finds(server, media):
    artifacts = [save_artifact(b"x", f"a{i}.txt") for i in range(3)]
    server.script("m-basic", [Reply(text("ok"), finish("stop")) for _ in range(2)])
    execute(start_run("basic", "one", thread="t-s", attachments=artifacts[:2]))
    execute(start_run("basic", "two", thread="t-s"))
    start_run("basic", "three", attachments=[artifacts[2]])
    expected = {a.pk for a in artifacts}
    assert connection.vendor == "postgresql"
    assert references.referenced_artifacts(Run.objects.all()) == expected
    assert references.scan_references(Run.objects.all()) == expected


def test_dry_run_reports_what_a_real_run_deletes_and_changes_nothing(server, media):
    full = _full_run(server)
    thread_runs = [_run("completed", thread="t-d"), _run("completed", thread="t-d")]
    Thread.objects.create(name="t-d")
    Thread.objects.update(created_at=Now() - timedelta(days=50))
    unused = save_artifact(b"unused", "u.txt")
    _age([full, *thread_runs, _run("failed")], days=40)
    _age_artifacts([unused], days=40)
    before = _everything()

    dry = prune("--older-than", "30d", "--threads", "--dry-run")

    assert _everything() == before
    assert default_storage.exists(unused.file.name)
    assert dry.startswith("Dry run, nothing deleted")
    real = prune("--older-than", "30d", "--threads")
    assert table(dry) == table(real)
    assert table(real)["Run"][0] == 4 and table(real)["Thread"][0] == 1 and table(real)["Artifact"][0] == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--older-than"),
        (["--older-than", "30"], "--older-than '30'"),
        (["--older-than", "30x"], "unit d, h, m or s"),
        (["--older-than", "0d"], "positive"),
        (["--older-than=-3d"], "positive"),
        (["--older-than", "1.5d"], "whole number"),
        (["--older-than", "30d", "--status", "running"], "a running run is not settled"),
        (["--older-than", "30d", "--status", "completed,queued"], "a queued run is not settled"),
        (["--older-than", "30d", "--status", "done"], "not a run status"),
        (["--older-than", "30d", "--status", " , "], "name one or more"),
        (["--older-than", "30d", "--batch-size", "0"], "at least 1"),
        (["--older-than", "30d", "--batch-size", "many"], "invalid int value"),
    ],
)
def test_bad_arguments_are_refused_and_change_nothing(args, message):
    _age([_run("completed"), _run("failed")], days=40)
    before = _everything()
    with pytest.raises(CommandError, match=re.escape(message)):
        prune(*args)
    assert _everything() == before


def test_batches_smaller_than_the_runs_delete_them_all():
    old = [_run("completed") for _ in range(7)]
    kept = _run("completed")
    _age(old, days=40)
    output = prune("--older-than", "30d", "--batch-size", "3")
    assert list(Run.objects.values_list("pk", flat=True)) == [kept.pk]
    assert Step.objects.count() == 1
    assert table(output)["Run"][0] == 7
    assert "3 batches of at most 3" in output


def test_a_run_another_transaction_holds_is_passed_over_without_waiting():
    held, free = _run("completed"), _run("completed")
    _age([held, free], days=40)
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                Run.objects.select_for_update().get(pk=held.pk)
                locked.set()
                release.wait(20)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(10)
        prune("--older-than", "30d")
        assert list(Run.objects.values_list("pk", flat=True)) == [held.pk]
        assert Step.objects.filter(run=held).exists() and Checkpoint.objects.filter(run=held).exists()
    finally:
        release.set()
        holder.join()
    prune("--older-than", "30d")
    assert not Run.objects.exists()


def test_prune_refuses_to_run_inside_a_transaction():
    _age([_run("completed")], days=40)
    with transaction.atomic(), pytest.raises(pruning.PruneRefused, match="outside atomic"):
        pruning.prune(pruning.Retention(older_than=timedelta(days=30)))
    assert Run.objects.count() == 1


def test_a_child_run_goes_with_the_run_that_started_it_never_alone(server):
    """A parent (its thread's latest, so kept) and another (old, not in a thread) each delegated
    once, long ago: the kept parent keeps its child, the other goes with its child and the wait
    point that named it; a batch smaller than a family still commits."""
    server.script(
        "m-triage",
        [
            *[Reply(tool_call("c1", "billing", '{"task": "a"}'), finish("tool_calls")) for _ in range(2)],
            *[Reply(text("done"), finish("stop")) for _ in range(2)],
        ],
    )
    server.script("m-billing", [Reply(text("ok"), finish("stop")) for _ in range(2)])
    kept = execute(start_run("triage", "x", thread="t-kept"))
    gone = execute(start_run("triage", "y"))
    children = {}
    for parent in (kept, gone):
        (children[parent.pk],) = Run.objects.filter(parent=parent)
        execute(children[parent.pk])
        assert execute(Run.objects.get(pk=parent.pk)).status == "completed"
    _age([kept, gone, *children.values()], days=40)

    prune("--older-than", "30d", "--batch-size", "1")

    assert set(Run.objects.values_list("pk", flat=True)) == {kept.pk, children[kept.pk].pk}
    assert WaitPoint.objects.get(run=kept).child_id == children[kept.pk].pk
    assert not WaitPoint.objects.filter(run=gone).exists()
