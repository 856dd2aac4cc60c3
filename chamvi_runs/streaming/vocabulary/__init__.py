"""The events a run's stream carries, the commands a socket takes and the replies it sends: the one
list from which docs/streaming.md's tables, the TypeScript declarations of ``client.d.ts`` and the
event types of ``client.js`` are written (``files``; ``python -m chamvi_runs.streaming.vocabulary
--write`` rewrites them).

The event types are ``events``' names, the ones the server builds its events with. A test holds
the server to this list: every event a real run streams has exactly the fields listed here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..events import (
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
        # ``parent_run_id``: on every event of a child run (SPEC §13), the run that delegated to it.
        return frozenset({"type", "run_id", "seq", "parent_run_id"} | {f.name for f in self.fields})


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
            Field(
                "parent",
                "ParentCall | null",
                "`{run_id, step, position}`: a child run's parent, and the call (the model call's step, "
                "the call's position in it) that started it",
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
            Field("tool_call_id", "string", "the model's id of the call; providers may reuse one"),
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
