// RunState and ThreadState fed event sequences as the server sends them: what a page would show.
import {test} from "node:test";
import assert from "node:assert/strict";

import {RunState, ThreadState, EVENT_TYPES} from "../../chamvi_runs/static/chamvi_runs/client.js";
import {
  SAMPLE, SAMPLE_TRANSCRIPT, RUN_ID, RETRIED, UNTIL_WAITING, APPROVAL_DEFAULTS, bySeq, docSample, numbered, shortRun, interleave, transcript,
} from "./fakes.mjs";


function applied(events, state = new RunState(events[0].run_id)) {
  for (const event of events) state.apply(event);
  return state;
}

test("the docs' sample run reads as its conversation, with the receipt at the end", () => {
  const state = applied(SAMPLE);
  assert.deepEqual(transcript(state), SAMPLE_TRANSCRIPT);
  assert.equal(state.status, "completed");
  assert.equal(state.waiting, null);
  assert.equal(state.ended, true);
  assert.equal(state.last_seq, 18);
  assert.deepEqual(state.end, {
    status: "completed",
    output: "Done: the refund is issued.",
    error: null,
    usage: {input_tokens: 410, output_tokens: 30},
    inputs: ["inp_4fT8"],
    decisions: SAMPLE.at(-1).decisions,
  });
  // run.end repeats the decision run.resume brought: it is shown once.
  assert.equal(state.decisions.length, 1);
  assert.deepEqual(state.tool(1).output, {order_id: "A-1001", total_cents: 4599});
  assert.equal(state.message(5).finish_reason, "stop");
});

test("every event type of the vocabulary is one the sample or the rebuild marker shows", () => {
  // The sample feeds these tests; an event type it lacks would go untested here.
  const seen = new Set([...SAMPLE, docSample("streaming-truncated")].map((e) => e.type));
  assert.deepEqual([...EVENT_TYPES].sort(), [...seen].sort());
});

test("an event already taken is skipped, whatever it says", () => {
  const state = applied(bySeq(1, 3));
  assert.equal(state.apply({...SAMPLE[2], text: " again"}), false);
  assert.equal(state.apply(SAMPLE[1]), false);
  assert.equal(state.message(0).text, "Let me look that order up.");
  assert.equal(state.last_seq, 3);
  assert.equal(state.apply({type: "delta", run_id: RUN_ID, step: 0, attempt: 1, kind: "text", text: "x"}), false,
    "an event without a seq is not taken");
});

test("a retried step shows only its highest attempt and drops what the older attempt started", () => {
  const state = new RunState("run_retry");
  applied(RETRIED.slice(0, 12), state);  // up to attempt 1's tool.call of step 3
  assert.deepEqual(transcript(state), [
    "message 0#1: Checking.",
    "tool 1 lookup_order done",
    'input inp_1: "hurry please"',
    "message 2#1: I will refund the wh",
    "tool 3 issue_refund",
  ]);
  assert.equal(state.message(2).reasoning, "The user is in a hurry");

  applied(RETRIED.slice(12, 15), state);  // run.resume, the input again, step.start attempt 2
  assert.deepEqual(transcript(state), [
    "message 0#1: Checking.",
    "tool 1 lookup_order done",
    'input inp_1: "hurry please"',
    "message 2#2: ",
  ], "attempt 2 starts empty; the stale tool call of step 3 is gone; the input is shown once");
  assert.equal(state.message(2).reasoning, "");
  assert.equal(state.message(2).finish_reason, null);

  assert.equal(state.apply(RETRIED[15]), true, "a late delta of attempt 1 is taken (its seq is new)…");
  assert.equal(state.message(2).text, "", "…but not shown");

  applied(RETRIED.slice(16), state);
  assert.deepEqual(transcript(state), [
    "message 0#1: Checking.",
    "tool 1 lookup_order done",
    'input inp_1: "hurry please"',
    "message 2#2: Refunding 1.00 now.",
  ]);
  assert.equal(state.message(2).finish_reason, "stop");
  assert.equal(state.tool(3), null);
  assert.equal(state.status, "completed");
});

test("a retry does not bring back an older attempt's events that come after it", () => {
  const state = applied(RETRIED);
  const late = numbered("run_retry", RETRIED.length + 1, [
    {type: "step.end", step: 2, attempt: 1, finish_reason: "length"},
    {type: "delta", step: 2, attempt: 1, kind: "reasoning", text: "stale"},
  ]);
  applied(late, state);
  assert.equal(state.message(2).attempt, 2);
  assert.equal(state.message(2).finish_reason, "stop");
  assert.equal(state.message(2).reasoning, "");
});

test("a retry keeps the decisions shown before it", () => {
  // Waited at step 3, approved, then step 4 crashed and is retried.
  const decision = {approval_id: "apr_1", tool_name: "issue_refund", decision: "approved", decided_by: "admin",
    decided_at: "2026-12-01T10:05:00+00:00", reason: ""};
  const events = numbered("run_d", 1, [
    {type: "run.start", status: "running"},
    {type: "step.start", step: 0, attempt: 1},
    {type: "delta", step: 0, attempt: 1, kind: "text", text: "Asking."},
    {type: "step.end", step: 0, attempt: 1, finish_reason: "tool_calls"},
    {type: "run.waiting", approval_id: "apr_1", tool_name: "issue_refund", input: {}, expires_at: null},
    {type: "run.resume", status: "running", decision},
    {type: "tool.call", step: 2, tool_call_id: "c1", name: "issue_refund", input: {}},
    {type: "tool.result", step: 2, tool_call_id: "c1", name: "issue_refund", output: "ok"},
    {type: "step.start", step: 3, attempt: 1},
    {type: "delta", step: 3, attempt: 1, kind: "text", text: "Don"},
    {type: "step.start", step: 3, attempt: 2},
    {type: "delta", step: 3, attempt: 2, kind: "text", text: "Done."},
  ]);
  const state = applied(events);
  assert.deepEqual(transcript(state), [
    "message 0#1: Asking.",
    "decision apr_1: approved",
    "tool 2 issue_refund done",
    "message 3#2: Done.",
  ]);
});

test("replay.truncated drops what was shown and the rebuild that follows shows the run once", () => {
  const state = applied(bySeq(1, 5));
  assert.equal(transcript(state).length, 2);
  // The buffer lost the run while it waited; the rebuild is numbered after its highest seq (10).
  const marker = {...docSample("streaming-truncated"), seq: 11};
  const rebuilt = UNTIL_WAITING.map(({seq, ...event}, n) => ({...event, seq: 12 + n}));
  assert.equal(state.apply(marker), true);
  assert.deepEqual(state.items, []);
  assert.equal(state.status, "waiting");
  assert.equal(state.from_step, 0);
  applied(rebuilt, state);
  assert.deepEqual(transcript(state), SAMPLE_TRANSCRIPT.slice(0, 3));
  assert.deepEqual(state.waiting, {
    ...APPROVAL_DEFAULTS,
    approval_id: "apr_9XkQ",
    tool_name: "issue_refund",
    input: {order_id: "A-1001", amount_cents: 4599},
    expires_at: "2026-12-02T10:00:01+00:00",
  });
  assert.equal(state.status, "waiting");
  assert.equal(state.last_seq, 12 + rebuilt.length - 1);
});

test("a replay.truncated at or below the seq taken is a restart: taken, and the run goes on from its seq", () => {
  const state = applied(bySeq(1, 10));
  assert.equal(state.last_seq, 10);
  // The server lost the run's seqs and numbers it from 1 again, behind a marker at 0.
  const restart = [{...docSample("streaming-truncated"), seq: 0}, ...UNTIL_WAITING.slice(0, 4)];
  assert.equal(state.apply(restart[0]), true);
  assert.equal(state.last_seq, 0);
  assert.deepEqual(state.items, []);
  applied(restart.slice(1), state);
  assert.equal(state.last_seq, 4);
  assert.deepEqual(transcript(state), ["message 0#1: Let me look that order up."]);
  // At the very seq taken (a region stored right after the run's highest seq) it is taken too.
  assert.equal(state.apply({...docSample("streaming-truncated"), seq: 4}), true);
  assert.deepEqual(state.items, []);
  // Other events at or below it are still skipped.
  assert.equal(state.apply(UNTIL_WAITING[2]), false);
});

test("replay.truncated also forgets an open approval and the receipt", () => {
  const state = applied(SAMPLE);
  state.apply({type: "replay.truncated", run_id: RUN_ID, seq: 19, status: "completed", from_step: 3});
  assert.equal(state.end, null);
  assert.equal(state.ended, false);
  assert.equal(state.waiting, null);
  assert.deepEqual(state.decisions, []);
  assert.equal(state.from_step, 3);
});

test("a run.waiting for an approval already decided does not reopen it", () => {
  const state = applied(bySeq(1, 11));
  assert.equal(state.waiting, null);
  // Announced again with a new seq (an execution that stopped before it saved what followed).
  assert.equal(state.apply({...SAMPLE[9], seq: 12}), true);
  assert.equal(state.waiting, null);
  assert.equal(state.status, "running");
  assert.equal(transcript(state).filter((line) => line.startsWith("decision")).length, 1);
});

test("a run cancelled while it waited shows the wait point as cancelled", () => {
  const state = applied(UNTIL_WAITING);
  const cancelled = {approval_id: "apr_9XkQ", tool_name: "issue_refund", decision: "cancelled",
    decided_by: null, decided_at: null, reason: ""};
  state.apply({type: "run.end", run_id: RUN_ID, seq: 11, status: "cancelled", output: null, error: null,
    usage: {input_tokens: 10, output_tokens: 2}, inputs: [], decisions: [cancelled]});
  assert.equal(state.status, "cancelled");
  assert.equal(state.waiting, null);
  assert.equal(transcript(state).at(-1), "decision apr_9XkQ: cancelled");
  assert.equal(state.end.status, "cancelled");
});

test("a failed tool shows its error and no output", () => {
  const state = applied(numbered("run_t", 1, [
    {type: "run.start", status: "running"},
    {type: "tool.call", step: 1, tool_call_id: "c", name: "lookup_order", input: {order_id: "X"}},
    {type: "tool.result", step: 1, tool_call_id: "c", name: "lookup_order", error: "no such order"},
  ]));
  assert.deepEqual({...state.tool(1)}, {kind: "tool", step: 1, tool_call_id: "c", name: "lookup_order",
    input: {order_id: "X"}, output: null, error: "no such order", done: true});
});

test("ThreadState keeps each run apart, in the order their first events came, each with its own seq", () => {
  const a = shortRun("run_a", "First answer.");
  const b = shortRun("run_b", "Second answer.");
  const thread = new ThreadState("customer-42");
  for (const event of interleave(b, a)) assert.ok(thread.apply(event), `${event.run_id} ${event.seq}`);
  assert.deepEqual([...thread.runs.keys()], ["run_b", "run_a"]);
  assert.equal(thread.run("run_a").message(0).text, "First answer.");
  assert.equal(thread.run("run_b").message(0).text, "Second answer.");
  assert.equal(thread.run("run_a").status, "completed");
  // A seq seen in one run is new in another.
  assert.equal(thread.apply(a[2]), null);
  assert.equal(thread.run("run_c"), null);
  assert.equal(thread.apply({type: "ack", action: "input", input_id: "x"}), null, "no run_id: no run");
});
