"""The events a run's stream carries, the commands a socket takes and the replies it sends: the one
list from which docs/streaming.md's tables, the TypeScript declarations of ``client.d.ts`` and the
event types of ``client.js`` are written (``python -m chamvi_runs.streaming.vocabulary --write``).

The event types are ``events``' names, the ones the server builds its events with. A test holds
the server to this list: every event a real run streams has exactly the fields listed here.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from .events import (
    DELTA,
    INPUT,
    REPLAY_TRUNCATED,
    RUN_END,
    RUN_RESUME,
    RUN_START,
    RUN_WAITING,
    STEP_END,
    STEP_START,
    TOOL_CALL,
    TOOL_RESULT,
)


@dataclass(frozen=True)
class Field:
    name: str
    ts: str  # its TypeScript type
    note: str = ""
    optional: bool = False  # absent from some events of the type


@dataclass(frozen=True)
class Event:
    type: str
    interface: str
    fields: tuple[Field, ...]
    when: str

    @property
    def required(self) -> frozenset[str]:
        return frozenset({"type", "run_id", "seq"} | {f.name for f in self.fields if not f.optional})

    @property
    def allowed(self) -> frozenset[str]:
        return frozenset({"type", "run_id", "seq"} | {f.name for f in self.fields})


STEP = Field("step", "number")
ATTEMPT = Field("attempt", "number")
STATUS = Field("status", "RunStatus")

EVENTS: tuple[Event, ...] = (
    Event(
        RUN_START,
        "RunStartEvent",
        (
            STATUS,
            Field("replaces", "string | null", "the run this one regenerates or resends"),
            Field(
                "replaced_by",
                "string | null",
                "the newest run that regenerates or resends this one: null live, set in a rebuild",
            ),
            Field(
                "forked_from",
                "ForkPoint | null",
                "`{run_id, step}`: a fork's start, after that step of that run; step -1: the history that "
                "run started from",
            ),
        ),
        "the first execution began",
    ),
    Event(
        RUN_RESUME,
        "RunResumeEvent",
        (
            STATUS,
            Field("decision", "Decision", "after a decision, an answer or an expiry", optional=True),
        ),
        "a later execution began (after a decision, a drain or a recovery)",
    ),
    Event(
        INPUT,
        "InputEvent",
        (STEP, Field("input_id", "string"), Field("payload", "Json")),
        "a steering input was taken into the conversation, before the model call of `step`; announced "
        "again by a later execution when that model call was not saved (show each `input_id` once)",
    ),
    Event(STEP_START, "StepStartEvent", (STEP, ATTEMPT), "a model call began"),
    Event(
        DELTA,
        "DeltaEvent",
        (
            STEP,
            ATTEMPT,
            Field("kind", '"text" | "reasoning"', "`text` or `reasoning`"),
            Field("text", "string"),
        ),
        "streamed text of the model call",
    ),
    Event(
        STEP_END,
        "StepEndEvent",
        (
            STEP,
            ATTEMPT,
            Field("finish_reason", "string | null", "`stop`, `tool_calls`, `length`, `error`, …"),
        ),
        "the model call ended",
    ),
    Event(
        TOOL_CALL,
        "ToolCallEvent",
        (STEP, Field("tool_call_id", "string | null"), Field("name", "string"), Field("input", "Json")),
        "a tool is about to run (`step` is the tool step's index)",
    ),
    Event(
        TOOL_RESULT,
        "ToolResultEvent",
        (
            STEP,
            Field("tool_call_id", "string | null"),
            Field("name", "string"),
            Field("output", "Json", "the tool's result, absent when it failed", optional=True),
            Field("error", "string", "the tool's error text, instead of `output`", optional=True),
        ),
        "its result",
    ),
    Event(
        RUN_WAITING,
        "RunWaitingEvent",
        (
            Field("approval_id", "string"),
            Field("kind", '"approval" | "input"', "`approval`, or `input`: a question"),
            Field("tool_name", "string"),
            Field("input", "Json", "the call's arguments"),
            Field("question", "string | null", "a question's text"),
            Field("answer_schema", "Json", "a question's JSON Schema of the answer; null: any JSON"),
            Field("client", "boolean", "a question the page's code answers: a client tool"),
            Field("editable", "boolean", "whether an approval may change the arguments"),
            Field("expires_at", "string | null"),
        ),
        "the run waits for a decision (an approval) or an answer (a question); one event per open wait "
        "point, so a model call that asks two questions sends two",
    ),
    Event(
        RUN_END,
        "RunEndEvent",
        (
            STATUS,
            Field("output", "Json"),
            Field("error", "RunError | null"),
            Field("usage", "Usage"),
            Field("inputs", "string[]", "the steering input ids it took"),
            Field(
                "decisions",
                "Decision[]",
                "every decided wait point, approvals and questions, oldest first, `cancelled` included",
            ),
        ),
        "the run settled: the receipt",
    ),
    Event(
        REPLAY_TRUNCATED,
        "ReplayTruncatedEvent",
        (STATUS, Field("from_step", "number")),
        "the events before this one are gone: drop what you showed, what follows rebuilds the run (below)",
    ),
)

BY_TYPE = {event.type: event for event in EVENTS}


@dataclass(frozen=True)
class Command:
    type: str
    interface: str
    fields: tuple[Field, ...]
    ack: tuple[Field, ...]


APPROVAL = Field("approval_id", "string")
REASON = Field("reason", "string", optional=True)
RUN_ON_THREAD = Field("run_id", "string", "on a thread socket", optional=True)
# An approval given with the arguments changed (only of a tool approved with editable=True).
ARGUMENTS = Field("arguments", "{[key: string]: Json}", "edited", optional=True)
# A regenerate or a resend names the run it started; a thread socket streams that run next.
AGAIN = (Field("run_id", "string", "the new run"), Field("replaces", "string"))

COMMANDS: tuple[Command, ...] = (
    Command(
        "input", "InputCommand", (Field("payload", "Json"), RUN_ON_THREAD), (Field("input_id", "string"),)
    ),
    Command("cancel", "CancelCommand", (RUN_ON_THREAD,), (Field("status", "RunStatus"),)),
    Command("approve", "ApproveCommand", (APPROVAL, REASON, ARGUMENTS), (APPROVAL,)),
    Command("deny", "DenyCommand", (APPROVAL, REASON), (APPROVAL,)),
    Command("answer", "AnswerCommand", (APPROVAL, Field("answer", "Json")), (APPROVAL,)),
    Command("regenerate", "RegenerateCommand", (RUN_ON_THREAD,), AGAIN),
    Command("resend", "ResendCommand", (Field("payload", "Json"), RUN_ON_THREAD), AGAIN),
)

ERROR_CODES: tuple[tuple[str, str], ...] = (
    (
        "invalid_message",
        "not JSON, not an object, nested deeper than 64 levels, binary frame, unknown `type`, no or a bad "
        "`approval_id`, a NUL or lone surrogate in `reason`, an `answer` command without its `answer`, a "
        "`resend` without its `payload`",
    ),
    ("not_found", "no such run, approval or question on this socket, or one the user may not view"),
    (
        "forbidden",
        "the user may view but not steer, cancel or decide; or answer a question: by default only the run's "
        "creator answers its questions; or regenerate or resend a run: that takes steering it and starting "
        "its agent",
    ),
    ("invalid_payload", "an input that cannot be stored (`null`, NUL, a lone surrogate)"),
    ("payload_too_large", "an input larger than `MAX_PAYLOAD_BYTES`"),
    ("too_many_inputs", "an input to a run that has taken `MAX_INPUTS` inputs"),
    (
        "inputs_pending",
        "an input while the inputs waiting for the run's next model call hold `MAX_PENDING_INPUT_BYTES`: "
        "send it once the model call has taken them",
    ),
    ("run_settled", "an input to a run that has ended"),
    ("run_active", "`regenerate` or `resend` of a run that has not settled"),
    (
        "history_unavailable",
        "`regenerate` or `resend` of a run whose history cannot be rebuilt: it saved no step, or a release "
        "that stored histories whole wrote it",
    ),
    ("thread_forbidden", "`regenerate` or `resend` in a thread whose history the user may not view"),
    ("already_decided", "a decision or answer refused: the wait point was decided or answered already"),
    ("expired", "a decision or answer refused: the wait point expired"),
    (
        "invalid_answer",
        "an answer that does not fit the question's `answer_schema` (the message names the field)",
    ),
    (
        "invalid_arguments",
        "edited `arguments` that are not an object or do not fit the tool's schema (the message names "
        "the field)",
    ),
    ("not_editable", "`arguments` given to approve a tool whose approvals may not change them"),
    ("wrong_kind", "`approve` or `deny` of a question, or `answer` of an approval"),
    ("internal_error", "the command failed unexpectedly (logged for the site)"),
    (
        "unauthenticated",
        "a command on a socket whose session ended (logged out, expired, the password changed, the user "
        "deactivated) or whose API token was deleted, then close 4401",
    ),
    (
        "invalid_after",
        "sent when connecting with a bad `?after=` (or a thread socket's `resume=`), then close 4400",
    ),
)

STATUSES = ("queued", "running", "waiting", "interrupted", "completed", "failed", "cancelled")


# --- what is written from it ----------------------------------------------------------------------


def _ts_fields(fields: tuple[Field, ...], indent: str = "  ") -> list[str]:
    return [f"{indent}{f.name}{'?' if f.optional else ''}: {f.ts};" for f in fields]


def typescript() -> str:
    """The declarations of the events, commands and replies (a region of client.d.ts)."""
    union = lambda values: " | ".join(f'"{v}"' for v in values)  # noqa: E731
    lines = [
        "export type Json = null | boolean | number | string | Json[] | {[key: string]: Json};",
        f"export type RunStatus = {union(STATUSES)};",
        f"export type EventType = {union(e.type for e in EVENTS)};",
        f"export type ErrorCode = {union(code for code, _ in ERROR_CODES)};",
        "export interface Usage { input_tokens: number; output_tokens: number; }",
        "export interface RunError { code: string; message: string; }",
        "/** Where a fork started: after step `step` of `run_id` (-1: the history that run started from). */",
        "export interface ForkPoint { run_id: string; step: number; }",
        "export interface Decision {",
        "  approval_id: string;",
        '  kind: "approval" | "input";',
        "  tool_name: string;",
        "  input: Json;",
        '  decision: "approved" | "denied" | "expired" | "cancelled" | "answered";',
        "  decided_by: string | null;",
        "  decided_at: string | null;",
        "  reason: string;",
        "  /** The arguments approved instead of the model's (null: as proposed, or not approved). */",
        "  approved_input: Json;",
        "  /** A question's answer (null until answered). */",
        "  answer: Json;",
        "}",
    ]
    for event in EVENTS:
        lines += [
            f"export interface {event.interface} {{",
            f'  type: "{event.type}";',
            "  run_id: string;",
            "  seq: number;",
            *_ts_fields(event.fields),
            "}",
        ]
    lines.append("export type RunEvent =\n" + "\n".join(f"  | {e.interface}" for e in EVENTS) + ";")
    lines.append("export interface EventsByType {")
    lines += [f'  "{e.type}": {e.interface};' for e in EVENTS]
    lines.append("}")
    for command in COMMANDS:
        lines += [f"export interface {command.interface} {{", f'  type: "{command.type}";']
        lines += [*_ts_fields(command.fields), "}"]
        lines += [f"export interface {command.interface[: -len('Command')]}Ack {{", '  type: "ack";']
        lines += [f'  action: "{command.type}";', *_ts_fields(command.ack), "}"]
    lines.append("export type Command = " + " | ".join(c.interface for c in COMMANDS) + ";")
    lines.append(
        "export type Ack = " + " | ".join(c.interface[: -len("Command")] + "Ack" for c in COMMANDS) + ";"
    )
    # Over Server-Sent Events the client answers commands with the HTTP API's codes, a wider set.
    lines.append(
        'export interface ErrorReply { type: "error"; code: ErrorCode | (string & {}); message: string; }'
    )
    lines.append("export type Reply = Ack | ErrorReply;")
    return "\n".join(lines) + "\n"


def javascript() -> str:
    """The event types as client.js lists them (it reads Server-Sent Events by name)."""
    types = "".join(f'  "{e.type}",\n' for e in EVENTS)
    return f"export const EVENT_TYPES = Object.freeze([\n{types}]);\n"


def _md_fields(fields: tuple[Field, ...]) -> str:
    shown = [f"`{f.name}`" + (f" ({f.note})" if f.note else "") for f in fields]
    return ", ".join(shown) or "—"


def markdown_events() -> str:
    rows = [f"| `{e.type}` | {_md_fields(e.fields)} | {e.when} |" for e in EVENTS]
    return "\n".join(["| type | extra fields | when |", "| --- | --- | --- |", *rows]) + "\n"


def markdown_commands() -> str:
    rows = []
    for c in COMMANDS:
        sent = ", ".join(
            [f'"type": "{c.type}"'] + [f'"{f.name}"{"?" if f.optional else ""}' for f in c.fields]
        )
        ack = ", ".join([f'"type": "ack", "action": "{c.type}"'] + [f'"{f.name}"' for f in c.ack])
        rows.append(f"| `{{{sent}}}` | `{{{ack}}}` |")
    return "\n".join(["| command | ack |", "| --- | --- |", *rows]) + "\n"


def markdown_errors() -> str:
    rows = [f"| `{code}` | {when} |" for code, when in ERROR_CODES]
    return "\n".join(["| code | when |", "| --- | --- |", *rows]) + "\n"


ROOT = Path(__file__).resolve().parents[2]
STATIC = Path(__file__).resolve().parents[1] / "static" / "chamvi_runs"


def regions() -> dict[Path, dict[str, str]]:
    """Each file written from the vocabulary: region name -> its text."""
    return {
        STATIC / "client.js": {"vocabulary": javascript()},
        STATIC / "client.d.ts": {"vocabulary": typescript()},
        ROOT / "docs" / "streaming.md": {
            "events": markdown_events(),
            "commands": markdown_commands(),
            "errors": markdown_errors(),
        },
    }


def _pattern(path: Path, name: str) -> re.Pattern[str]:
    if path.suffix == ".md":
        start, end = rf"<!-- vocabulary: {name} -->\n", rf"<!-- /vocabulary: {name} -->"
    else:
        start, end = rf"// <{name}>[^\n]*\n", rf"// </{name}>"
    return re.compile(f"({start})(.*?)({end})", re.S)


def region_of(path: Path, name: str) -> str | None:
    match = _pattern(path, name).search(path.read_text())
    return match.group(2) if match else None


def write() -> list[Path]:
    """Rewrites every region from the vocabulary; returns the files that changed."""
    changed = []
    for path, texts in regions().items():
        before = path.read_text()
        after = before
        for name, text in texts.items():
            match = _pattern(path, name).search(after)
            if match is None:
                raise SystemExit(f"{path}: no region {name!r} to write")
            after = after[: match.start(2)] + text + after[match.end(2) :]
        if after != before:
            path.write_text(after)
            changed.append(path)
    return changed


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python -m chamvi_runs.streaming.vocabulary --write")
    for path in write():
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
