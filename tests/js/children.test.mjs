// Child runs (SPEC §13) in client.js: a parent's socket carries its children's events, each with
// its parent_run_id; the client keeps each child's state below its parent's, under the call that
// started it, resumes them on a reconnect, and decides a child's approval from the parent.
import {test, beforeEach} from "node:test";
import assert from "node:assert/strict";

import {RunState, ThreadState, connectRun, connectThread} from "../../chamvi_runs/static/chamvi_runs/client.js";
import {FakeWebSocket, LOCATION, fastBackoff, numbered, waitFor} from "./fakes.mjs";

const base = () => ({WebSocket: FakeWebSocket, location: LOCATION, backoff: fastBackoff()});
beforeEach(() => FakeWebSocket.reset());

const PARENT = "run_desk";
const CHILD = "run_refunds";
const END = {type: "run.end", status: "completed", output: "done", error: null,
  usage: {input_tokens: 1, output_tokens: 1}, inputs: [], decisions: []};

/** The parent delegates at step 0 (call position 1); the child streams, then waits for an approval. */
const PARENT_EVENTS = numbered(PARENT, 1, [
  {type: "run.start", status: "running", replaces: null, replaced_by: null, forked_from: null, parent: null},
  {type: "step.start", step: 0, attempt: 1},
  {type: "step.end", step: 0, attempt: 1, finish_reason: "tool_calls"},
]);
const CHILD_EVENTS = numbered(CHILD, 1, [
  {type: "run.start", status: "running", replaces: null, replaced_by: null, forked_from: null,
    parent: {run_id: PARENT, step: 0, position: 1}},
  {type: "step.start", step: 0, attempt: 1},
  {type: "delta", step: 0, attempt: 1, kind: "text", text: "Refunding "},
  {type: "delta", step: 0, attempt: 1, kind: "text", text: "order 7."},
  {type: "step.end", step: 0, attempt: 1, finish_reason: "tool_calls"},
  {type: "run.waiting", approval_id: "apv_1", kind: "approval", tool_name: "refund", input: {order_id: "7"},
    question: null, answer_schema: null, client: false, editable: true, expires_at: null},
]).map((event) => ({...event, parent_run_id: PARENT}));

test("a child's events build its state below its parent's, under the call that started it", () => {
  const state = new RunState(PARENT);
  for (const event of PARENT_EVENTS) state.apply(event);
  for (const event of CHILD_EVENTS) assert.ok(state.applyBelow(event));
  const child = state.find(CHILD);
  assert.deepEqual(child.parent, {run_id: PARENT, step: 0, position: 1});
  assert.deepEqual(state.childrenOf(0).map((c) => c.run_id), [CHILD]);
  assert.equal(child.message(0).text, "Refunding order 7.");
  assert.equal(state.holder("apv_1"), child);
  assert.deepEqual(state.allWaits().map((w) => w.approval_id), ["apv_1"]);
  assert.equal(state.waiting, null, "the parent's own waits are its own");
  // Replayed again (a reconnect from 0): nothing changes twice.
  for (const event of CHILD_EVENTS) assert.equal(state.applyBelow(event), null);
  assert.equal(child.message(0).text, "Refunding order 7.");
});

test("a run client shows its child, resumes it on reconnect and approves its refund", async () => {
  const client = connectRun(PARENT, base());
  const seen = [];
  client.on("event", (event, state) => seen.push(`${state.run_id}:${event.seq}`));
  const first = FakeWebSocket.last;
  first.open();
  first.messages([...PARENT_EVENTS, ...CHILD_EVENTS.slice(0, 3)]);
  assert.equal(client.state.find(CHILD).message(0).text, "Refunding ");
  assert.equal(client.done(), false);

  first.serverClose(1006);
  await waitFor(() => FakeWebSocket.instances.length === 2, "the reconnect");
  const second = FakeWebSocket.last;
  assert.equal(second.url, `ws://example.test/ws/chamvi/runs/${PARENT}/?after=3&resume=${encodeURIComponent(`${CHILD}:3`)}`);
  second.open();
  second.messages(CHILD_EVENTS.slice(2));  // the server's overlap, then the rest
  assert.equal(client.state.find(CHILD).message(0).text, "Refunding order 7.");
  assert.deepEqual(client.openWaits().map((w) => w.approval_id), ["apv_1"]);

  const approved = client.approve({approvalId: "apv_1"});
  assert.deepEqual(second.sent.at(-1), {type: "approve", approval_id: "apv_1"});
  second.message({type: "ack", action: "approve", approval_id: "apv_1"});
  assert.deepEqual(await approved, {type: "ack", action: "approve", approval_id: "apv_1"});
  assert.deepEqual(client.openWaits(), [], "the child's wait is closed by the ack");

  // The child ends; the parent goes on and ends: only the parent's end ends the client.
  second.message({...END, run_id: CHILD, seq: 7, parent_run_id: PARENT});
  assert.equal(client.done(), false);
  assert.equal(client.state.find(CHILD).ended, true);
  second.message({...END, run_id: PARENT, seq: 4});
  assert.equal(client.done(), true);
  assert.deepEqual(
    seen,
    [1, 2, 3].map((n) => `${PARENT}:${n}`).concat([1, 2, 3, 4, 5, 6, 7].map((n) => `${CHILD}:${n}`), [`${PARENT}:4`]),
    "each event reaches the page once, with the state of its run",
  );
  client.close();
});

test("a thread shows a child below the thread's run, never as a run of its own", async () => {
  const thread = new ThreadState("support");
  for (const event of PARENT_EVENTS) thread.apply(event);
  for (const event of CHILD_EVENTS) assert.ok(thread.apply(event));
  assert.deepEqual([...thread.runs.keys()], [PARENT]);
  assert.equal(thread.run(PARENT).find(CHILD).waiting.approval_id, "apv_1");

  const client = connectThread("support", base());
  const changed = [];
  client.on("change", (state) => changed.push(state.run_id));
  const socket = FakeWebSocket.last;
  socket.open();
  socket.messages([...PARENT_EVENTS, ...CHILD_EVENTS]);
  assert.deepEqual(client.runs().map((run) => run.run_id), [PARENT]);
  assert.equal(changed.at(-1), PARENT, "a child's event changes the thread's run that holds it");
  assert.deepEqual(client.openWaits().map((w) => w.approval_id), ["apv_1"]);
  socket.serverClose(1006);
  await waitFor(() => FakeWebSocket.instances.length === 2, "the reconnect");
  assert.match(decodeURIComponent(FakeWebSocket.last.url), new RegExp(`resume=${PARENT}:3,${CHILD}:6`));
  client.close();
});

test("a reconnect names at most 50 runs to resume, children counted, the latest kept", async () => {
  const client = connectThread("busy", base());
  const socket = FakeWebSocket.last;
  socket.open();
  // 50 runs of the thread, the last of which delegated once.
  for (let n = 0; n < 50; n++) socket.message({type: "run.start", run_id: `run_${n}`, seq: 1, status: "running"});
  socket.message({...CHILD_EVENTS[0], parent: {run_id: "run_49", step: 0, position: 0}, parent_run_id: "run_49"});
  socket.serverClose(1006);
  await waitFor(() => FakeWebSocket.instances.length === 2, "the reconnect");
  const resume = new URL(FakeWebSocket.last.url).searchParams.get("resume").split(",");
  assert.equal(resume.length, 50);
  assert.equal(resume.at(-1), `${CHILD}:1`);
  assert.equal(resume[0], "run_1:1", "the oldest run is left to the server's replay");
  client.close();
});
