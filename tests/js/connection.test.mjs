// RunClient and ThreadClient over a fake websocket: reconnects, replays, commands and their answers.
import {test, beforeEach} from "node:test";
import assert from "node:assert/strict";

import {
  Backoff, ChamviError, RunClient, connectRun, connectThread,
} from "../../chamvi_runs/static/chamvi_runs/client.js";
import {
  FakeWebSocket, LOCATION, SAMPLE, SAMPLE_TRANSCRIPT, RUN_ID, UNTIL_WAITING, APPROVAL_DEFAULTS, bySeq, numbered, shortRun, interleave, transcript,
  fakeFetch, fastBackoff, outcome, flush, waitFor,
} from "./fakes.mjs";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const base = () => ({WebSocket: FakeWebSocket, location: LOCATION, backoff: fastBackoff()});

beforeEach(() => FakeWebSocket.reset());

/** connectRun with the fakes; `statuses` records every connection change from here on. */
function follow(options = {}, runId = RUN_ID) {
  const client = connectRun(runId, {...base(), ...options});
  const changes = [];
  client.on("connection", (change) => changes.push(change));
  return {client, changes, statuses: () => changes.map((c) => c.status)};
}

function streamed(events) {
  return numbered(RUN_ID, 1, events);
}

/** A model message that streams in several deltas. */
const CHATTY = streamed([
  {type: "run.start", status: "running"},
  {type: "step.start", step: 0, attempt: 1},
  {type: "delta", step: 0, attempt: 1, kind: "text", text: "Hel"},
  {type: "delta", step: 0, attempt: 1, kind: "text", text: "lo, "},
  {type: "delta", step: 0, attempt: 1, kind: "text", text: "wor"},
  {type: "delta", step: 0, attempt: 1, kind: "text", text: "ld."},
  {type: "step.end", step: 0, attempt: 1, finish_reason: "stop"},
  {type: "run.end", status: "completed", output: "Hello, world.", error: null,
    usage: {input_tokens: 3, output_tokens: 4}, inputs: [], decisions: []},
]);

test("the socket URL names the run and the seq to resume after", () => {
  connectRun("run 1/x", {...base(), location: {protocol: "https:", host: "chat.example.test:8443"}, after: 7});
  assert.equal(FakeWebSocket.last.url, "wss://chat.example.test:8443/ws/chamvi/runs/run%201%2Fx/?after=7");
  connectRun(RUN_ID, {...base(), socketBase: "/sub/ws/chamvi/"});
  assert.equal(FakeWebSocket.last.url, "ws://example.test/sub/ws/chamvi/runs/run_2bq0/?after=0");
});

test("scenario 1: a drop mid-step reconnects after the last seq; the replayed overlap adds no text", async (t) => {
  t.mock.timers.enable({apis: ["setTimeout"]});
  const {client, changes, statuses} = follow({backoff: new Backoff({initial: 200, random: () => 0})});
  const seen = [];
  client.on("event", (event) => seen.push(event.seq));
  const first = FakeWebSocket.last;
  first.open();
  first.messages(CHATTY.slice(0, 4));  // up to "lo, "
  assert.equal(client.state.message(0).text, "Hello, ");

  first.serverClose(1006);
  assert.equal(client.connection, "reconnecting");
  assert.deepEqual(changes.at(-1), {status: "reconnecting", transport: "websocket", delay: 100, code: 1006});
  t.mock.timers.tick(99);
  assert.equal(FakeWebSocket.instances.length, 1, "no reconnect before the backoff's delay");
  t.mock.timers.tick(1);
  assert.equal(FakeWebSocket.instances.length, 2);
  const second = FakeWebSocket.last;
  assert.equal(second.after, "4");
  assert.equal(second.url, "ws://example.test/ws/chamvi/runs/run_2bq0/?after=4");

  second.open();
  second.messages(CHATTY.slice(2));  // the server's overlap: seq 3 and 4 again, then the rest
  assert.equal(client.state.message(0).text, "Hello, world.");
  assert.deepEqual(seen, [1, 2, 3, 4, 5, 6, 7, 8], "each event reaches the page once, in order");
  assert.deepEqual(statuses(), ["open", "reconnecting", "connecting", "open", "closed"]);
  assert.equal(client.state.status, "completed");
  await flush();
  assert.equal(second.clientClose, 1000);
  t.mock.timers.tick(60_000);
  assert.equal(FakeWebSocket.instances.length, 2, "a settled run is not followed again");
});

test("scenario 1: the docs' run, cut twice and replayed with overlaps, shows each item once in order", async () => {
  const {client, statuses} = follow();
  const first = FakeWebSocket.last;
  first.open();
  first.messages(bySeq(1, 7));
  first.serverClose(1001);
  await waitFor(() => FakeWebSocket.instances.length === 2, "the first reconnect");
  const second = FakeWebSocket.last;
  assert.equal(second.after, "7");
  second.open();
  second.messages(bySeq(3, 12));
  second.serverClose(1006);
  await waitFor(() => FakeWebSocket.instances.length === 3, "the second reconnect");
  const third = FakeWebSocket.last;
  assert.equal(third.after, "12");
  third.open();
  third.messages(bySeq(1, 18));  // a server that replays everything: all already seen is skipped
  assert.deepEqual(transcript(client.state), SAMPLE_TRANSCRIPT);
  assert.deepEqual(statuses(), ["open", "reconnecting", "connecting", "open", "reconnecting", "connecting", "open", "closed"]);
  assert.equal(client.state.last_seq, 18);
});

test("scenario 1: a gap is not papered over: events after the gap still come in seq order", () => {
  // What the client takes is what the server sends after `after`: it never reorders.
  const {client} = follow();
  const socket = FakeWebSocket.last;
  socket.open();
  socket.messages([SAMPLE[0], SAMPLE[2], SAMPLE[1]]);
  assert.equal(client.state.last_seq, 3);
  assert.equal(client.state.message(0).text, "Let me look that order up.");
  client.close();
});

test("a reconnect answered with replay.truncated starts the page over, and the rebuild shows the run once", async () => {
  const {client} = follow();
  const changes = [];
  client.on("change", (state) => changes.push([state.last_seq, state.items.length]));
  const first = FakeWebSocket.last;
  first.open();
  first.messages(bySeq(1, 6));
  first.serverClose(1006);
  await waitFor(() => FakeWebSocket.instances.length === 2, "the reconnect");
  const second = FakeWebSocket.last;
  assert.equal(second.after, "6");
  second.open();
  // The buffer was lost while the run waited: a marker numbered after its highest seq (10), then
  // the rebuild from its stored steps.
  second.message({type: "replay.truncated", run_id: RUN_ID, seq: 11, status: "waiting", from_step: 0});
  assert.deepEqual(client.state.items, []);
  assert.equal(client.state.status, "waiting");
  second.messages(UNTIL_WAITING.map(({seq, ...event}, n) => ({...event, seq: 12 + n})));
  assert.deepEqual(transcript(client.state), [
    "message 0#1: Let me look that order up.",
    "tool 1 lookup_order done",
    "message 2#1: A colleague has to approve the refund.",
  ]);
  assert.equal(client.state.waiting.approval_id, "apr_9XkQ");
  assert.deepEqual(changes.find(([seq]) => seq === 11), [11, 0], "the page is told to drop what it showed");
  assert.deepEqual(changes.find(([seq]) => seq === 6), [6, 2]);
  client.close();
});

test("scenario 3: a thread socket keeps interleaved runs apart and skips each run's replay on reconnect", async () => {
  const client = connectThread("customer-42", base());
  const runs = [];
  const seen = [];
  client.on("run", (state) => runs.push(state.run_id));
  client.on("event", (event, state) => seen.push(`${state.run_id}:${event.seq}`));
  const a = shortRun("run_a", "First answer.");
  const b = shortRun("run_b", "Second answer.");
  const both = interleave(a, b);
  const first = FakeWebSocket.last;
  assert.equal(first.url, "ws://example.test/ws/chamvi/threads/customer-42/?after=0");
  first.open();
  first.messages(both.slice(0, 7));  // run_a up to its 4th event, run_b up to its 3rd
  assert.deepEqual(runs, ["run_a", "run_b"]);
  assert.equal(client.state.run("run_a").message(0).text, "First answer.");
  assert.equal(client.state.run("run_b").message(0).text, "Second ");

  first.serverClose(1006);
  await waitFor(() => FakeWebSocket.instances.length === 2, "the reconnect");
  const second = FakeWebSocket.last;
  assert.equal(second.after, "0", "a run the client has not seen yet comes from its start");
  assert.equal(second.resume, "run_a:4,run_b:3", "each run it has resumes after its own seq");
  second.open();
  const c = shortRun("run_c", "Third.");
  // As a server of the previous version answers (everything from 0): the client skips what it has.
  second.messages([...both, ...c]);
  assert.deepEqual(runs, ["run_a", "run_b", "run_c"], "the run listener fires once per new run");
  assert.equal(client.state.run("run_a").message(0).text, "First answer.");
  assert.equal(client.state.run("run_b").message(0).text, "Second answer.");
  assert.equal(client.state.run("run_c").message(0).text, "Third.");
  assert.deepEqual(seen, [
    ...both.map((e) => `${e.run_id}:${e.seq}`),
    ...c.map((e) => `${e.run_id}:${e.seq}`),
  ].filter((key, n, all) => all.indexOf(key) === n));
  assert.equal(seen.length, a.length + b.length + c.length);
  assert.equal(new Set(seen).size, seen.length, "no event twice");
  // A run's end does not end the thread's socket.
  await flush();
  assert.equal(second.clientClose, null);
  assert.equal(client.connection, "open");
  client.close();
});

test("a thread socket that lost a run's seqs (Redis lost its data) serves the client's seq: the run ends on the page", async () => {
  const client = connectThread("customer-42", base());
  const a = shortRun("run_a", "First answer.");
  const first = FakeWebSocket.last;
  first.open();
  first.messages(a.slice(0, 3));  // run.start, step.start, "First "
  first.serverClose(1006);
  await waitFor(() => FakeWebSocket.instances.length === 2, "the reconnect");
  const second = FakeWebSocket.last;
  assert.equal(second.resume, "run_a:3");
  second.open();
  // What the server answers once it no longer knows the run's seqs: a restart, the run rebuilt from
  // seq 1 behind a marker (stored nowhere) at seq 0, below the client's seq.
  second.messages(numbered("run_a", 0, [
    {type: "replay.truncated", status: "completed", from_step: 0},
    {type: "run.start", status: "running"},
    {type: "step.start", step: 0, attempt: 1},
    {type: "delta", step: 0, attempt: 1, kind: "text", text: "First answer."},
    {type: "step.end", step: 0, attempt: 1, finish_reason: "stop"},
    {type: "run.end", status: "completed", output: "First answer.", error: null,
      usage: {input_tokens: 5, output_tokens: 5}, inputs: [], decisions: []},
  ]));
  const run = client.state.run("run_a");
  assert.equal(run.status, "completed");
  assert.deepEqual(transcript(run), ["message 0#1: First answer."]);
  assert.equal(run.end.output, "First answer.");
  assert.equal(run.last_seq, 5);
  client.close();
});

test("a restart on reconnect (the server lost the run's seqs): the page starts over and resumes by the new seqs", async () => {
  const {client} = follow();
  const first = FakeWebSocket.last;
  first.open();
  first.messages(CHATTY.slice(0, 5));  // up to "wor", seq 5
  first.serverClose(1006);
  await waitFor(() => FakeWebSocket.instances.length === 2, "the reconnect");
  const second = FakeWebSocket.last;
  assert.equal(second.after, "5");
  second.open();
  // Redis lost the run's seqs after seq 2 reached another process: the server holds 1..2 only.
  const restart = numbered(RUN_ID, 0, [
    {type: "replay.truncated", status: "running", from_step: 0},
    {type: "run.start", status: "running"},
    {type: "step.start", step: 0, attempt: 1},
    {type: "delta", step: 0, attempt: 1, kind: "text", text: "Hello, wor"},
  ]);
  second.messages(restart);
  assert.equal(client.state.last_seq, 3);
  assert.deepEqual(transcript(client.state), ["message 0#1: Hello, wor"]);
  second.messages(numbered(RUN_ID, 4, [{type: "delta", step: 0, attempt: 1, kind: "text", text: "ld."}]));
  assert.deepEqual(transcript(client.state), ["message 0#1: Hello, world."]);
  second.serverClose(1006);
  await waitFor(() => FakeWebSocket.instances.length === 3, "the next reconnect");
  assert.equal(FakeWebSocket.last.after, "4", "it resumes after the seqs the server numbers now");
  client.close();
});

test("a thread client resumes at most its latest 50 runs by seq", async () => {
  const client = connectThread("customer-42", base());
  const first = FakeWebSocket.last;
  first.open();
  for (let n = 0; n < 60; n++) first.message(shortRun(`run_${n}`, "Hi.")[0]);
  first.serverClose(1006);
  await waitFor(() => FakeWebSocket.instances.length === 2, "the reconnect");
  const resumed = FakeWebSocket.last.resume.split(",");
  assert.equal(resumed.length, 50);
  assert.deepEqual([resumed[0], resumed.at(-1)], ["run_10:1", "run_59:1"]);
  client.close();
});

test("a thread's commands name their run; decisions their approval", async () => {
  const client = connectThread("customer-42", base());
  const socket = FakeWebSocket.last;
  socket.open();
  const input = client.input("run_b", {text: "more"});
  const cancel = client.cancel("run_a");
  const approve = client.approve("apr_1", {reason: "fine"});
  const deny = client.deny("apr_2");
  assert.deepEqual(socket.sent, [
    {type: "input", run_id: "run_b", payload: {text: "more"}},
    {type: "cancel", run_id: "run_a"},
    {type: "approve", approval_id: "apr_1", reason: "fine"},
    {type: "deny", approval_id: "apr_2"},
  ]);
  socket.messages([
    {type: "ack", action: "input", input_id: "inp_9"},
    {type: "ack", action: "cancel", status: "cancelled"},
    {type: "ack", action: "approve", approval_id: "apr_1"},
    {type: "ack", action: "deny", approval_id: "apr_2"},
  ]);
  assert.equal((await input).input_id, "inp_9");
  assert.equal((await cancel).status, "cancelled");
  assert.equal((await approve).approval_id, "apr_1");
  assert.equal((await deny).action, "deny");
  client.close();
});

test("scenario 4: approve from run.waiting, then run.resume closes the wait for good", async () => {
  const {client} = follow();
  const socket = FakeWebSocket.last;
  socket.open();
  socket.messages(UNTIL_WAITING);
  assert.equal(client.state.status, "waiting");
  assert.deepEqual(client.state.waiting, {
    ...APPROVAL_DEFAULTS,
    approval_id: "apr_9XkQ",
    tool_name: "issue_refund",
    input: {order_id: "A-1001", amount_cents: 4599},
    expires_at: "2026-12-02T10:00:01+00:00",
  });

  const approved = client.approve({reason: "photos checked"});
  assert.deepEqual(socket.sent, [{type: "approve", approval_id: "apr_9XkQ", reason: "photos checked"}]);
  socket.message({type: "ack", action: "approve", approval_id: "apr_9XkQ"});
  assert.deepEqual(await approved, {type: "ack", action: "approve", approval_id: "apr_9XkQ"});

  socket.message(SAMPLE[10]);  // run.resume with the decision
  assert.equal(client.state.waiting, null);
  assert.equal(client.state.status, "running");
  assert.deepEqual(transcript(client.state).at(-1), "decision apr_9XkQ: approved");
  assert.equal(client.state.decisions[0].reason, "photos checked");

  // A reconnect whose replay starts before the decision does not bring the wait back.
  socket.serverClose(1006);
  await waitFor(() => FakeWebSocket.instances.length === 2, "the reconnect");
  const again = FakeWebSocket.last;
  assert.equal(again.after, "11");
  again.open();
  again.messages(bySeq(10, 12));
  assert.equal(client.state.waiting, null);
  // Nor does the same wait announced again with a new seq.
  again.message({...SAMPLE[9], seq: 13});
  assert.equal(client.state.waiting, null);
  assert.equal(client.state.status, "running");
  const rest = bySeq(13, 18).map((e) => ({...e, seq: e.seq + 1}));
  again.messages(rest);
  assert.equal(client.state.status, "completed");
  assert.equal(transcript(client.state).filter((l) => l.startsWith("decision")).length, 1);
});

test("deny sends no reason when none is given; with nothing waiting, a decision is refused at once", async () => {
  const {client} = follow();
  const socket = FakeWebSocket.last;
  socket.open();
  const none = outcome(client.approve());
  await none.promise;
  assert.equal(none.ok, false);
  assert.ok(none.error instanceof ChamviError);
  assert.equal(none.error.code, "not_found");
  assert.deepEqual(socket.sent, []);

  socket.messages(UNTIL_WAITING);
  const denied = client.deny();
  assert.deepEqual(socket.sent, [{type: "deny", approval_id: "apr_9XkQ"}]);
  socket.message({type: "ack", action: "deny", approval_id: "apr_9XkQ"});
  assert.equal((await denied).action, "deny");
  const other = client.approve({approvalId: "apr_other"});
  assert.deepEqual(socket.sent.at(-1), {type: "approve", approval_id: "apr_other"});
  socket.message({type: "error", code: "already_decided", message: "it was decided already"});
  await assert.rejects(other, {name: "ChamviError", code: "already_decided", message: "it was decided already"});
  client.close();
});

const CANCEL_END = {type: "run.end", run_id: RUN_ID, seq: 9, status: "cancelled", output: null, error: null,
  usage: {input_tokens: 40, output_tokens: 8}, inputs: [], decisions: []};

test("scenario 5: cancel resolves with its ack; run.end closes the socket with 1000, for good", async () => {
  const {client, statuses} = follow();
  const socket = FakeWebSocket.last;
  socket.open();
  socket.messages(bySeq(1, 8));
  const cancelled = client.cancel();
  assert.deepEqual(socket.sent, [{type: "cancel"}]);
  socket.message({type: "ack", action: "cancel", status: "cancelled"});
  assert.deepEqual(await cancelled, {type: "ack", action: "cancel", status: "cancelled"});

  socket.message(CANCEL_END);
  assert.equal(client.state.status, "cancelled");
  assert.deepEqual(client.state.end, {status: "cancelled", output: null, error: null,
    usage: {input_tokens: 40, output_tokens: 8}, inputs: [], decisions: []});
  assert.equal(client.connection, "closed");
  await flush();
  assert.equal(socket.clientClose, 1000);
  await sleep(10);  // several backoff delays
  assert.equal(FakeWebSocket.instances.length, 1, "no reconnect after run.end");
  assert.deepEqual(statuses(), ["open", "closed"]);

  await assert.rejects(client.input("too late"), {name: "ChamviError", code: "run_settled"});
  await assert.rejects(client.cancel(), {code: "run_settled"});
  assert.deepEqual(socket.sent, [{type: "cancel"}], "nothing sent after the end");
});

test("scenario 5: a run.end before the cancel's ack keeps the socket until the ack comes", async () => {
  const {client} = follow();
  const socket = FakeWebSocket.last;
  socket.open();
  socket.messages(bySeq(1, 8));
  const cancelled = client.cancel();
  socket.message(CANCEL_END);
  assert.equal(client.state.ended, true);
  await flush();
  assert.equal(socket.clientClose, null, "the cancel still waits for its answer");
  socket.message({type: "ack", action: "cancel", status: "cancelled"});
  assert.equal((await cancelled).status, "cancelled");
  await flush();
  assert.equal(socket.clientClose, 1000);
  await sleep(10);
  assert.equal(FakeWebSocket.instances.length, 1);
});

test("scenario 5: a run cancelled while it waited ends with the wait point shown as cancelled", async () => {
  const {client} = follow();
  const socket = FakeWebSocket.last;
  socket.open();
  socket.messages(UNTIL_WAITING);
  const cancelled = client.cancel();
  socket.message({type: "ack", action: "cancel", status: "cancelled"});
  await cancelled;
  const decision = {approval_id: "apr_9XkQ", tool_name: "issue_refund", decision: "cancelled",
    decided_by: null, decided_at: null, reason: ""};
  socket.message({...CANCEL_END, seq: 11, decisions: [decision]});
  assert.equal(client.state.waiting, null);
  assert.equal(transcript(client.state).at(-1), "decision apr_9XkQ: cancelled");
  await assert.rejects(client.approve({approvalId: "apr_9XkQ"}), {code: "run_settled"});
});

test("replies answer commands in the order they were sent; an error rejects with its code and message", async () => {
  const {client} = follow();
  const socket = FakeWebSocket.last;
  const replies = [];
  client.on("reply", (reply) => replies.push(reply.type));
  socket.open();
  const one = outcome(client.input("one"));
  const two = outcome(client.input(null));
  const three = outcome(client.input({n: 3}));
  assert.deepEqual(socket.sent.map((c) => c.payload), ["one", null, {n: 3}]);
  socket.message({type: "ack", action: "input", input_id: "inp_1"});
  socket.message({type: "error", code: "invalid_payload", message: "an input cannot be null"});
  socket.message({type: "ack", action: "input", input_id: "inp_3"});
  await Promise.all([one.promise, two.promise, three.promise]);
  assert.deepEqual(one.value, {type: "ack", action: "input", input_id: "inp_1"});
  assert.equal(two.ok, false);
  assert.ok(two.error instanceof ChamviError);
  assert.ok(two.error instanceof Error);
  assert.deepEqual([two.error.code, two.error.message, two.error.status], ["invalid_payload", "an input cannot be null", null]);
  assert.equal(three.value.input_id, "inp_3");
  assert.deepEqual(replies, ["ack", "error", "ack"]);
  client.close();
});

test("a command made before the socket opens is queued and sent once it opens, also after a reconnect", async () => {
  const {client} = follow();
  const first = FakeWebSocket.last;
  const early = client.input("before open");
  assert.deepEqual(first.sent, []);
  first.open();
  assert.deepEqual(first.sent, [{type: "input", payload: "before open"}]);
  first.message({type: "ack", action: "input", input_id: "inp_1"});
  assert.equal((await early).input_id, "inp_1");

  first.serverClose(1006);
  const during = client.input("while reconnecting");
  await waitFor(() => FakeWebSocket.instances.length === 2, "the reconnect");
  const second = FakeWebSocket.last;
  assert.deepEqual(second.sent, []);
  second.open();
  assert.deepEqual(second.sent, [{type: "input", payload: "while reconnecting"}]);
  assert.equal(first.sent.length, 1, "nothing on the dropped socket");
  second.message({type: "ack", action: "input", input_id: "inp_2"});
  assert.equal((await during).input_id, "inp_2");
  client.close();
});

test("a command in flight when the socket drops rejects with connection_lost; the next socket's answers are its own", async () => {
  const {client} = follow();
  const first = FakeWebSocket.last;
  first.open();
  const lost = outcome(client.cancel());
  first.serverClose(1006);
  await lost.promise;
  assert.equal(lost.ok, false);
  assert.equal(lost.error.code, "connection_lost");
  await waitFor(() => FakeWebSocket.instances.length === 2, "the reconnect");
  const second = FakeWebSocket.last;
  second.open();
  const next = client.input("again");
  second.message({type: "ack", action: "input", input_id: "inp_2"});
  assert.equal((await next).input_id, "inp_2");
  client.close();
});

test("close 4403: the client gives up with forbidden and does not reconnect", async () => {
  const {client, changes} = follow();
  const socket = FakeWebSocket.last;
  socket.open();  // the server accepts, then closes at once
  socket.serverClose(4403);
  assert.equal(client.connection, "closed");
  const last = changes.at(-1);
  assert.equal(last.status, "closed");
  assert.equal(last.code, "forbidden");
  assert.ok(last.error instanceof ChamviError);
  assert.equal(last.error.code, "forbidden");
  assert.equal(client.error.code, "forbidden");
  await sleep(10);
  assert.equal(FakeWebSocket.instances.length, 1);
  await assert.rejects(client.input("x"), {code: "forbidden"});
  assert.ok(!changes.some((c) => c.status === "reconnecting"));
});

test("close 4401 (the session ended): the command is refused, and the client reports it and does not reconnect", async () => {
  const {client, changes} = follow();
  const socket = FakeWebSocket.last;
  socket.open();
  socket.messages(UNTIL_WAITING);
  const approval = outcome(client.approve());
  await flush();
  socket.message({type: "error", code: "unauthenticated", message: "the session has ended: log in again"});
  socket.serverClose(4401);
  await approval.promise;
  assert.equal(approval.error.code, "unauthenticated");
  assert.equal(client.connection, "closed");
  assert.equal(changes.at(-1).code, "unauthenticated");
  assert.equal(client.error.code, "unauthenticated");
  assert.equal(client.error.status, 4401);
  await sleep(10);
  assert.equal(FakeWebSocket.instances.length, 1);
  assert.ok(!changes.some((c) => c.status === "reconnecting"));
});

test("with an API token the socket offers it as a subprotocol beside chamvi, never in the URL", () => {
  connectRun(RUN_ID, {...base(), token: "chv_s3cret"});
  const socket = FakeWebSocket.last;
  assert.deepEqual(socket.protocols, ["chamvi", "chamvi.bearer.chv_s3cret"]);
  assert.ok(!socket.url.includes("s3cret"));
  connectThread("customer-42", {...base(), token: "chv_s3cret"});
  assert.deepEqual(FakeWebSocket.last.protocols, ["chamvi", "chamvi.bearer.chv_s3cret"]);
  connectRun(RUN_ID, base());
  assert.deepEqual(FakeWebSocket.last.protocols, [], "a session's socket offers no subprotocol");
});

test("close 4400 after invalid_after: the client gives up with invalid_after", async () => {
  const {client, changes} = follow({after: 3});
  const replies = [];
  client.on("reply", (reply) => replies.push(reply));
  const socket = FakeWebSocket.last;
  socket.open();
  socket.message({type: "error", code: "invalid_after", message: "after must be digits"});
  socket.serverClose(4400, "bad after");
  assert.equal(changes.at(-1).code, "invalid_after");
  assert.equal(client.error.message, "bad after");
  assert.deepEqual(replies.map((r) => r.code), ["invalid_after"]);
  await sleep(10);
  assert.equal(FakeWebSocket.instances.length, 1);
});

test("a command unanswered in time rejects with timeout; its late answer does not go to the next one", async (t) => {
  t.mock.timers.enable({apis: ["setTimeout"]});
  const {client} = follow({commandTimeout: 1000});
  const socket = FakeWebSocket.last;
  socket.open();
  const slow = outcome(client.input("slow"));
  t.mock.timers.tick(1000);
  await slow.promise;
  assert.equal(slow.error.code, "timeout");
  const next = outcome(client.input("next"));
  socket.message({type: "ack", action: "input", input_id: "inp_slow"});
  await flush();
  assert.equal(next.done, false, "the late ack answered the command that timed out");
  socket.message({type: "ack", action: "input", input_id: "inp_next"});
  await next.promise;
  assert.equal(next.value.input_id, "inp_next");
  client.close();
});

test("a command queued while the socket never opens rejects with timeout and is never sent", async (t) => {
  t.mock.timers.enable({apis: ["setTimeout"]});
  const {client} = follow({commandTimeout: 500});
  const queued = outcome(client.input("x"));
  t.mock.timers.tick(500);
  await queued.promise;
  assert.equal(queued.error.code, "timeout");
  FakeWebSocket.last.open();
  assert.deepEqual(FakeWebSocket.last.sent, []);
  client.close();
});

test("a command unanswered at run.end times out, and then the settled run's socket is closed", async (t) => {
  t.mock.timers.enable({apis: ["setTimeout"]});
  const {client} = follow({commandTimeout: 1000});
  const socket = FakeWebSocket.last;
  socket.open();
  socket.messages(bySeq(1, 8));
  const cancelled = outcome(client.cancel());
  socket.message(CANCEL_END);
  assert.equal(client.connection, "closed");
  t.mock.timers.tick(1000);
  await cancelled.promise;
  assert.equal(cancelled.error.code, "timeout");
  await flush();
  assert.equal(socket.clientClose, 1000, "the socket of a settled run is closed once nothing waits on it");
});

test("close() stops following: no reconnect, commands in flight rejected with closed", async () => {
  const {client, statuses} = follow();
  const socket = FakeWebSocket.last;
  socket.open();
  socket.messages(bySeq(1, 3));
  const inFlight = outcome(client.input("x"));
  client.close();
  await inFlight.promise;
  assert.equal(inFlight.error.code, "closed");
  assert.equal(client.connection, "closed");
  await flush();
  assert.equal(socket.clientClose, 1000);
  await sleep(10);
  assert.equal(FakeWebSocket.instances.length, 1);
  assert.deepEqual(statuses(), ["open", "closed"]);
  await assert.rejects(client.input("after close"), {code: "closed"});
  client.close();  // twice is harmless
});

test("a reconnect that is cut before it opens waits longer each time (the backoff grows until a message comes)", async (t) => {
  t.mock.timers.enable({apis: ["setTimeout"]});
  const {client, changes} = follow({transport: "websocket", backoff: new Backoff({initial: 100, max: 400, random: () => 1})});
  FakeWebSocket.last.open();
  FakeWebSocket.last.serverClose(1006);
  for (let n = 0; n < 4; n++) {
    t.mock.timers.tick(changes.at(-1).delay);
    FakeWebSocket.last.refuse();
  }
  const delays = changes.filter((c) => c.status === "reconnecting").map((c) => c.delay);
  assert.deepEqual(delays, [100, 200, 400, 400, 400]);
  assert.equal(FakeWebSocket.instances.length, 5, "transport websocket never falls back to SSE");
  t.mock.timers.tick(400);
  FakeWebSocket.last.open();
  FakeWebSocket.last.message(SAMPLE[0]);
  FakeWebSocket.last.serverClose(1006);
  assert.equal(changes.at(-1).delay, 100, "a message resets the backoff");
  client.close();
});

test("listeners: per event type, change, removal, and one that throws does not stop the others", async () => {
  const reported = [];
  const saved = globalThis.reportError;
  globalThis.reportError = (error) => reported.push(error.message);
  try {
    const {client} = follow();
    const deltas = [];
    const changes = [];
    client.on("delta", () => { throw new Error("page bug"); });
    const off = client.on("delta", (event, state) => deltas.push([event.text, state.message(event.step).text]));
    client.on("change", (state) => changes.push(state.last_seq));
    const socket = FakeWebSocket.last;
    socket.open();
    socket.messages(CHATTY.slice(0, 4));
    off();
    socket.messages(CHATTY.slice(4, 6));
    assert.deepEqual(deltas, [["Hel", "Hel"], ["lo, ", "Hello, "]]);
    assert.deepEqual(changes, [1, 2, 3, 4, 5, 6]);
    assert.deepEqual(reported, ["page bug", "page bug", "page bug", "page bug"]);
    assert.equal(client.state.message(0).text, "Hello, world.");
    client.close();
  } finally {
    globalThis.reportError = saved;
  }
});

test("events of another run, replies that are not JSON, and unknown types change nothing", () => {
  const {client} = follow();
  const seen = [];
  client.on("event", (event) => seen.push(event.seq));
  const socket = FakeWebSocket.last;
  socket.open();
  socket.message(SAMPLE[0]);
  socket.message({...SAMPLE[2], run_id: "run_other", seq: 2});
  socket.message("not json");
  socket.message({type: "run.future", run_id: RUN_ID, seq: 2});
  assert.deepEqual(seen, [1]);
  assert.deepEqual(client.state.items, []);
  client.close();
});

test("a RunClient made without start() opens nothing until started", () => {
  const client = new RunClient(RUN_ID, base());
  assert.equal(FakeWebSocket.instances.length, 0);
  assert.equal(client.start(), client);
  assert.equal(FakeWebSocket.instances.length, 1);
  client.close();
});

test("options given as undefined keep their defaults: the socket resumes from 0 and commands wait 15 s", async (t) => {
  t.mock.timers.enable({apis: ["setTimeout"]});
  const {client} = follow({after: undefined, commandTimeout: undefined, backoff: undefined});
  const socket = FakeWebSocket.last;
  assert.equal(socket.after, "0");
  socket.open();
  const input = outcome(client.input("x"));
  t.mock.timers.tick(14_999);
  await flush();
  assert.equal(input.done, false, "the command still waits for its answer");
  socket.message({type: "ack", action: "input", input_id: "inp_1"});
  await input.promise;
  assert.equal(input.value.input_id, "inp_1");
  client.close();
});

test("a socket that finishes its handshake after close() brings the client back neither open nor sending", async () => {
  const {client, statuses} = follow();
  const queued = outcome(client.input("x"));
  const socket = FakeWebSocket.last;
  client.close();
  socket.open();
  await queued.promise;
  assert.equal(queued.error.code, "closed");
  assert.deepEqual(statuses(), ["closed"]);
  assert.equal(client.connection, "closed");
  assert.deepEqual(socket.sent, []);
});

test("a socket that stayed open 5 s reconnects at the shortest delay again (a run waiting for approval sends nothing)", async (t) => {
  t.mock.timers.enable({apis: ["setTimeout"]});
  const {client, changes} = follow({backoff: new Backoff({initial: 100, max: 10_000, random: () => 1})});
  const delays = () => changes.filter((c) => c.status === "reconnecting").map((c) => c.delay);
  FakeWebSocket.last.open();
  FakeWebSocket.last.serverClose(1006);
  t.mock.timers.tick(100);
  FakeWebSocket.last.refuse();
  t.mock.timers.tick(200);
  FakeWebSocket.last.open();
  FakeWebSocket.last.messages(UNTIL_WAITING);  // the run waits: nothing more comes
  FakeWebSocket.last.serverClose(1006);
  t.mock.timers.tick(100);
  FakeWebSocket.last.open();
  t.mock.timers.tick(4_999);
  FakeWebSocket.last.serverClose(1006);
  assert.deepEqual(delays(), [100, 200, 100, 200], "4.999 s is not long enough");
  t.mock.timers.tick(200);
  FakeWebSocket.last.open();
  t.mock.timers.tick(5_000);
  FakeWebSocket.last.serverClose(1006);
  assert.deepEqual(delays(), [100, 200, 100, 200, 100]);
  client.close();
});

test("a server that accepts every socket and drops it at once is called again later each time", async (t) => {
  t.mock.timers.enable({apis: ["setTimeout"]});
  const {client, changes} = follow({backoff: new Backoff({initial: 100, max: 10_000, random: () => 1})});
  for (let n = 0; n < 4; n++) {
    FakeWebSocket.last.open();
    FakeWebSocket.last.serverClose(1011);
    t.mock.timers.tick(changes.at(-1).delay);
  }
  assert.deepEqual(changes.filter((c) => c.status === "reconnecting").map((c) => c.delay), [100, 200, 400, 800]);
  client.close();
});

test("a thread socket dropped at once after replaying what the client has is called again later each time", async (t) => {
  t.mock.timers.enable({apis: ["setTimeout"]});
  const client = connectThread("customer-42", {...base(), backoff: new Backoff({initial: 100, max: 10_000, random: () => 1})});
  const delays = [];
  client.on("connection", (change) => { if (change.status === "reconnecting") delays.push(change.delay); });
  const a = shortRun("run_a", "First answer.");
  FakeWebSocket.last.open();
  FakeWebSocket.last.messages(a);
  for (let n = 0; n < 4; n++) {
    FakeWebSocket.last.serverClose(1011);
    t.mock.timers.tick(delays.at(-1));
    FakeWebSocket.last.open();
    // Replayed events the client has, and an ack: no progress.
    FakeWebSocket.last.messages([...a, {type: "ack", action: "input", input_id: "inp_0"}]);
  }
  assert.deepEqual(delays, [100, 200, 400, 800]);
  client.close();
});

test("a command whose payload is not JSON rejects at once and takes no answer's place", async () => {
  const {client} = follow();
  const socket = FakeWebSocket.last;
  socket.open();
  const loop = {};
  loop.self = loop;
  await assert.rejects(client.input({amount: 10n}), {code: "invalid_message"});
  await assert.rejects(client.input(loop), {code: "invalid_message"});
  assert.deepEqual(socket.sent, []);
  const next = client.input("fine");
  socket.message({type: "ack", action: "input", input_id: "inp_7"});
  assert.deepEqual(await next, {type: "ack", action: "input", input_id: "inp_7"});
  client.close();
});

test("after run.end, a command that timed out keeps its place: its late answer goes to nobody else", async (t) => {
  t.mock.timers.enable({apis: ["setTimeout"]});
  const {client} = follow({commandTimeout: 1000});
  const socket = FakeWebSocket.last;
  socket.open();
  socket.messages(bySeq(1, 8));
  const input = outcome(client.input("one more thing"));
  t.mock.timers.tick(500);
  const cancel = outcome(client.cancel());
  socket.message(CANCEL_END);
  t.mock.timers.tick(500);
  await input.promise;
  assert.equal(input.error.code, "timeout");
  socket.message({type: "ack", action: "input", input_id: "inp_1"});  // the late answer to input
  await flush();
  assert.equal(cancel.done, false, "the input's late answer is not the cancel's");
  socket.message({type: "ack", action: "cancel", status: "cancelled"});
  await cancel.promise;
  assert.deepEqual(cancel.value, {type: "ack", action: "cancel", status: "cancelled"});
  await flush();
  assert.equal(socket.clientClose, 1000, "nothing waits any more: the settled run's socket is closed");
});

/** The timers set from here on and not yet fired or cleared. */
function liveTimers(t) {
  const live = new Set();
  const {setTimeout: set, clearTimeout: clear} = globalThis;
  globalThis.setTimeout = (callback, ms, ...args) => {
    const id = set(() => {
      live.delete(id);
      callback(...args);
    }, ms);
    live.add(id);
    return id;
  };
  globalThis.clearTimeout = (id) => {
    live.delete(id);
    clear(id);
  };
  t.after(() => Object.assign(globalThis, {setTimeout: set, clearTimeout: clear}));
  return live;
}

test("close() leaves no timer behind: no reconnect, no command's timeout, no backoff reset", async (t) => {
  const live = liveTimers(t);
  const {client} = follow();
  FakeWebSocket.last.open();
  const sent = outcome(client.input("x"));
  assert.ok(live.size >= 2, "an open socket and a command in flight have their timers");
  client.close();
  await sent.promise;
  assert.equal(live.size, 0);

  const dropped = follow().client;
  FakeWebSocket.last.open();
  FakeWebSocket.last.serverClose(1006);
  const queued = outcome(dropped.input("y"));
  dropped.close();
  await queued.promise;
  assert.equal(live.size, 0);

  const fetch = fakeFetch({onPost: () => new Promise(() => {})});
  const sse = connectRun(RUN_ID, {...base(), transport: "sse", fetch});
  await waitFor(() => sse.connection === "open", "the stream");
  const posted = outcome(sse.input("z"));
  sse.close();
  await posted.promise;
  assert.equal(posted.error.code, "closed");
  assert.equal(live.size, 0);
});

test("a thread client names the thread's scope when given one, also on every reconnect", () => {
  const own = connectThread("customer-42", base());
  assert.equal(FakeWebSocket.last.url, "ws://example.test/ws/chamvi/threads/customer-42/?after=0");
  own.close();
  const staff = connectThread("customer-42", {...base(), scope: "user:7"});
  const socket = FakeWebSocket.last;
  assert.equal(socket.url, "ws://example.test/ws/chamvi/threads/customer-42/?after=0&scope=user%3A7");
  socket.open();
  socket.messages(shortRun("run_a", "Hi.").slice(0, 2));
  socket.serverClose(1006);
  return waitFor(() => FakeWebSocket.last !== socket, "a reconnect").then(() => {
    assert.match(FakeWebSocket.last.url, /\?after=0&resume=run_a%3A2&scope=user%3A7$/);
    const global = connectThread("support-7", {...base(), scope: ""});
    assert.equal(FakeWebSocket.last.url, "ws://example.test/ws/chamvi/threads/support-7/?after=0&scope=");
    staff.close();
    global.close();
  });
});
