"""What is written from the vocabulary: the TypeScript declarations of ``client.d.ts``, the event
types of ``client.js`` and the tables of docs/streaming.md, each between the markers of a region of
its file (``python -m chamvi_runs.streaming.vocabulary --write`` rewrites them).
"""

from __future__ import annotations

import re
from pathlib import Path

from . import COMMANDS, ERROR_CODES, EVENTS, STATUSES, Field


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
        "/** A child run's parent, and its call that started the child: the model call's step and the",
        "    call's position in it. */",
        "export interface ParentCall { run_id: string; step: number; position: number; }",
        "export interface Decision {",
        "  approval_id: string;",
        '  kind: "approval" | "input" | "child";',
        "  tool_name: string;",
        "  input: Json;",
        '  decision: "approved" | "denied" | "expired" | "cancelled" | "answered" | "failed";',
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
            "  /** A child run's event: the run that delegated to it. */",
            "  parent_run_id?: string;",
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


# From chamvi_runs/streaming/vocabulary/: the checkout's root (docs/) and the app's static folder.
ROOT = Path(__file__).resolve().parents[3]
STATIC = Path(__file__).resolve().parents[2] / "static" / "chamvi_runs"


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
