// Questions to the user and edited approvals (issue 19): several open wait points, answers over the
// socket and over HTTP, approvals with changed arguments, and the page's client tools.
import {test, beforeEach} from "node:test";
import assert from "node:assert/strict";

import {
  RunState, answerQuestion, connectRun, connectThread, decideApproval,
} from "../../chamvi_runs/static/chamvi_runs/client.js";
import {
  FakeWebSocket, LOCATION, SAMPLE, UNTIL_WAITING, fakeFetch, fastBackoff, flush, jsonResponse, numbered, outcome,
  transcript, waitFor,
} from "./fakes.mjs";

const RUN = "run_ask";
const base = () => ({WebSocket: FakeWebSocket, location: LOCATION, backoff: fastBackoff()});

beforeEach(() => FakeWebSocket.reset());

/** A run.waiting as a server of this release sends it. */
function question(approvalId, text, {client = false, tool = "ask_user", input = {question: text}} = {}) {
  return {
    type: "run.waiting", approval_id: approvalId, kind: "input", tool_name: tool,
    tool_call_id: `call_${approvalId}`, input, question: text, answer_schema: {type: "string"}, client,
    editable: false, expires_at: null,
  };
}

function decision(approvalId, answer, tool = "ask_user") {
  return {
    approval_id: approvalId, kind: "input", tool_name: tool, input: {question: "?"}, decision: "answered",
    decided_by: "ann", decided_at: "2026-12-01T10:05:00+00:00", reason: "", approved_input: null, answer,
  };
}

/** One model call that asks two questions: the run waits on both. */
const TWO_QUESTIONS = numbered(RUN, 1, [
  {type: "run.start", status: "running"},
  {type: "step.start", step: 0, attempt: 1},
  {type: "delta", step: 0, attempt: 1, kind: "text", text: "Two things first."},
  {type: "step.end", step: 0, attempt: 1, finish_reason: "tool_calls"},
  question("apr_size", "Which size?"),
  question("apr_colour", "Which colour?"),
]);

/** A run whose model calls the page's client tool `get_location`. */
const LOCATING = numbered(RUN, 1, [
  {type: "run.start", status: "running"},
  {type: "step.start", step: 0, attempt: 1},
  {type: "step.end", step: 0, attempt: 1, finish_reason: "tool_calls"},
  question("apr_loc", null, {client: true, tool: "get_location", input: {precision: "city"}}),
]);

function follow(options = {}) {
  const client = connectRun(RUN, {...base(), ...options});
  const socket = FakeWebSocket.last;
  socket.open();
  return {client, socket};
}

const ids = (state) => state.waits.map((wait) => wait.approval_id);

/** Records what reportError gets while `body` runs. */
async function reporting(body) {
  const reported = [];
  const saved = globalThis.reportError;
  globalThis.reportError = (error) => reported.push(error);
  try {
    await body(reported);
  } finally {
    globalThis.reportError = saved;
  }
}

test("two run.waiting events open two waits in order; waiting is the first; a replayed one is not added twice", () => {
  const state = new RunState(RUN);
  for (const event of TWO_QUESTIONS) state.apply(event);
  assert.equal(state.status, "waiting");
  assert.deepEqual(ids(state), ["apr_size", "apr_colour"]);
  assert.equal(state.waiting, state.waits[0]);
  assert.deepEqual(state.waiting, {
    approval_id: "apr_size", kind: "input", tool_name: "ask_user", tool_call_id: "call_apr_size",
    input: {question: "Which size?"}, question: "Which size?", answer_schema: {type: "string"}, client: false,
    editable: false, expires_at: null,
  });
  // The same wait point announced again by a later execution: one wait, still in its place.
  state.apply({...TWO_QUESTIONS[4], seq: 7});
  assert.deepEqual(ids(state), ["apr_size", "apr_colour"]);
});

test("the run resuming or ending closes its waits; a decision item keeps the wait's kind as wait_kind", () => {
  const state = new RunState(RUN);
  for (const event of TWO_QUESTIONS) state.apply(event);
  // A run.end's decisions close the waits they name (a run cancelled while two questions waited).
  const ended = new RunState(RUN);
  for (const event of TWO_QUESTIONS) ended.apply(event);
  ended.apply({type: "run.end", run_id: RUN, seq: 7, status: "cancelled", output: null, error: null,
    usage: {input_tokens: 1, output_tokens: 1}, inputs: [], decisions: [{...decision("apr_size", null), decision: "cancelled"}]});
  assert.deepEqual(ended.waits, []);
  assert.equal(ended.waiting, null);

  state.apply({type: "run.resume", run_id: RUN, seq: 7, status: "running", decision: decision("apr_colour", "red")});
  assert.deepEqual(state.waits, [], "a run resumes once every wait point of its model call is decided");
  assert.equal(state.waiting, null);
  const item = state.items.at(-1);
  assert.equal(item.kind, "decision");
  assert.equal(item.wait_kind, "input");
  assert.equal(item.answer, "red");
  assert.deepEqual(transcript(state).at(-1), "decision apr_colour: answered");
  // A replay of the answered question does not open it again.
  state.apply({...TWO_QUESTIONS[5], seq: 8});
  assert.deepEqual(ids(state), []);
});

test("a run.waiting of a server before questions is an approval, as before", () => {
  const state = new RunState(SAMPLE[0].run_id);
  const {kind, tool_call_id, question: q, answer_schema, client, editable, ...old} = UNTIL_WAITING.at(-1);
  for (const event of [...UNTIL_WAITING.slice(0, -1), old]) state.apply(event);
  assert.deepEqual(state.waits, [state.waiting]);
  assert.deepEqual(state.waiting, {
    approval_id: old.approval_id, kind: "approval", tool_name: old.tool_name, tool_call_id: null, input: old.input,
    question: null, answer_schema: null, client: false, editable: false, expires_at: old.expires_at,
  });
  assert.equal(state.status, "waiting");
});

test("answering one of two questions over the socket closes it at its ack; the run still waits on the other", async () => {
  const {client, socket} = follow();
  socket.messages(TWO_QUESTIONS);
  const changes = [];
  client.on("change", (state) => changes.push(ids(state)));
  const first = client.answer({answer: "M"});
  assert.deepEqual(socket.sent, [{type: "answer", approval_id: "apr_size", answer: "M"}]);
  assert.deepEqual(ids(client.state), ["apr_size", "apr_colour"], "open until the server took it");
  socket.message({type: "ack", action: "answer", approval_id: "apr_size"});
  assert.deepEqual(await first, {type: "ack", action: "answer", approval_id: "apr_size"});
  assert.deepEqual(ids(client.state), ["apr_colour"]);
  assert.equal(client.state.waiting.approval_id, "apr_colour");
  assert.equal(client.state.status, "waiting");
  assert.deepEqual(changes, [["apr_colour"]], "the page is told");

  const second = client.answer({approvalId: "apr_colour", answer: {name: "red", hex: "#f00"}});
  assert.deepEqual(socket.sent.at(-1), {type: "answer", approval_id: "apr_colour", answer: {name: "red", hex: "#f00"}});
  socket.message({type: "error", code: "invalid_answer", message: "answer: Input should be a valid string"});
  await assert.rejects(second, {name: "ChamviError", code: "invalid_answer", message: "answer: Input should be a valid string"});
  assert.deepEqual(ids(client.state), ["apr_colour"], "a refused answer leaves the question open");

  // Someone else answered it meanwhile: refused, and no longer open either.
  const late = client.answer({answer: "blue"});
  socket.message({type: "error", code: "already_decided", message: "it was answered already"});
  await assert.rejects(late, {code: "already_decided"});
  assert.deepEqual(client.state.waits, []);
  await assert.rejects(client.answer({answer: "green"}), {code: "not_found"}, "nothing left to answer");
  assert.equal(socket.sent.length, 3);
  client.close();
});

test("a replay rebuilds the open waits; one this client answered is not opened again", async () => {
  const {client, socket} = follow();
  socket.messages(TWO_QUESTIONS);
  const answered = client.answer({answer: "M"});
  socket.message({type: "ack", action: "answer", approval_id: "apr_size"});
  await answered;
  socket.serverClose(1006);
  await waitFor(() => FakeWebSocket.instances.length === 2, "the reconnect");
  const again = FakeWebSocket.last;
  assert.equal(again.after, "6");
  again.open();
  // The buffer was lost: a marker, then the run rebuilt from its steps, both questions included
  // (the server's rebuild may still hold the first: the run has not resumed).
  again.message({type: "replay.truncated", run_id: RUN, seq: 7, status: "waiting", from_step: 0});
  assert.deepEqual(client.state.waits, [], "the marker drops what was shown");
  again.messages(TWO_QUESTIONS.map(({seq, ...event}, n) => ({...event, seq: 8 + n})));
  assert.deepEqual(ids(client.state), ["apr_colour"]);
  assert.equal(client.state.message(0).text, "Two things first.");
  client.close();
});

test("over Server-Sent Events, answer and an edited approval are HTTP POSTs with their bodies", async () => {
  const fetch = fakeFetch({
    onPost(url, body) {
      if (url.endsWith("/answer/")) return jsonResponse(200, {approval_id: "apr_size", decision: "answered", answer: body.answer});
      return jsonResponse(200, {approval_id: "apr_refund", decision: "approved", approved_input: body.arguments});
    },
  });
  const client = connectRun(RUN, {WebSocket: null, fetch, location: LOCATION, backoff: fastBackoff(), csrfToken: "tok"});
  const replies = [];
  client.on("reply", (reply) => replies.push(reply));
  await waitFor(() => fetch.streams.length === 1, "the stream");
  fetch.streams[0].events(TWO_QUESTIONS);
  await waitFor(() => client.state.waits.length === 2, "the waits");

  assert.deepEqual(await client.answer({answer: "M"}), {type: "ack", action: "answer", approval_id: "apr_size"});
  assert.deepEqual(ids(client.state), ["apr_colour"]);
  const edited = {order_id: "A-1001", amount_cents: 2000};
  assert.deepEqual(await client.approve({approvalId: "apr_refund", arguments: edited, reason: "half"}),
    {type: "ack", action: "approve", approval_id: "apr_refund"});
  assert.deepEqual(fetch.posts.map((p) => [p.url, p.body, p.headers["X-CSRFToken"]]), [
    ["/chamvi/api/approvals/apr_size/answer/", {answer: "M"}, "tok"],
    ["/chamvi/api/approvals/apr_refund/approve/", {reason: "half", arguments: edited}, "tok"],
  ]);
  assert.deepEqual(replies.map((r) => r.action), ["answer", "approve"]);
  // A payload that is not JSON rejects before any request.
  await assert.rejects(client.answer({answer: 10n}), {code: "invalid_message"});
  await assert.rejects(client.answer({approvalId: "apr_colour"}), {code: "invalid_message"}, "no answer given");
  assert.equal(fetch.posts.length, 2);
  client.close();
});

test("approve sends edited arguments when given, and only then; arguments that are not an object or JSON are refused", async () => {
  const {client, socket} = follow({after: 0});
  socket.messages(numbered(RUN, 1, [
    {type: "run.start", status: "running"},
    {type: "run.waiting", approval_id: "apr_refund", kind: "approval", tool_name: "issue_refund",
      input: {order_id: "A-1", amount_cents: 4599}, question: null, answer_schema: null, client: false,
      editable: true, expires_at: null},
  ]));
  assert.equal(client.state.waiting.editable, true);
  const plain = client.approve({reason: "ok"});
  const edited = client.approve({arguments: {order_id: "A-1", amount_cents: 100}});
  assert.deepEqual(socket.sent, [
    {type: "approve", approval_id: "apr_refund", reason: "ok"},
    {type: "approve", approval_id: "apr_refund", arguments: {order_id: "A-1", amount_cents: 100}},
  ]);
  socket.message({type: "ack", action: "approve", approval_id: "apr_refund"});
  socket.message({type: "error", code: "already_decided", message: "decided already"});
  await plain;
  await assert.rejects(edited, {code: "already_decided"});
  await assert.rejects(client.approve({approvalId: "apr_x", arguments: [1, 2]}), {code: "invalid_arguments"});
  await assert.rejects(client.approve({approvalId: "apr_x", arguments: {n: 1n}}), {code: "invalid_message"});
  assert.equal(socket.sent.length, 2, "a refused command sends nothing");
  client.close();
});

test("approve and answer default to the open wait of their own kind", async () => {
  const {client, socket} = follow();
  socket.messages(numbered(RUN, 1, [
    {type: "run.start", status: "running"},
    question("apr_q", "Sure?"),
    {type: "run.waiting", approval_id: "apr_a", kind: "approval", tool_name: "refund", input: {}, question: null,
      answer_schema: null, client: false, editable: true, expires_at: null},
  ]));
  void outcome(client.approve());
  void outcome(client.answer({answer: true}));
  assert.deepEqual(socket.sent, [
    {type: "approve", approval_id: "apr_a"},
    {type: "answer", approval_id: "apr_q", answer: true},
  ]);
  client.close();
});

test("decideApproval takes edited arguments; answerQuestion answers over HTTP with the notifier's token", async () => {
  const fetch = fakeFetch({
    onPost(url, body) {
      if (body.answer === "late") return jsonResponse(410, {error: {code: "expired", message: "the question expired"}});
      return jsonResponse(200, {approval_id: "apr_1", decision: url.endsWith("/answer/") ? "answered" : "approved"});
    },
  });
  const approved = await decideApproval("apr_1", "approve", {arguments: {amount_cents: 5}, fetch, csrfToken: ""});
  assert.equal(approved.decision, "approved");
  const answered = await answerQuestion("apr_1", {size: "M"}, {token: "t0k", fetch, csrfToken: ""});
  assert.equal(answered.decision, "answered");
  assert.deepEqual(fetch.posts.map((p) => [p.url, p.body]), [
    ["/chamvi/api/approvals/apr_1/approve/", {arguments: {amount_cents: 5}}],
    ["/chamvi/api/approvals/apr_1/answer/", {answer: {size: "M"}, token: "t0k"}],
  ]);
  await assert.rejects(answerQuestion("apr_1", "late", {fetch}), {code: "expired", status: 410});
  await assert.rejects(answerQuestion("apr_1", 1n, {fetch}), {code: "invalid_message"});
  await assert.rejects(answerQuestion("apr_1", undefined, {fetch}), {code: "invalid_message"});
  await assert.rejects(decideApproval("apr_1", "deny", {arguments: {amount_cents: 5}, fetch}), {code: "invalid_message"});
  assert.equal(fetch.posts.length, 3, "nothing is sent for a request refused at once");
});

test("a client tool answers its question once with what its handler returns, even when a replay repeats the wait", async () => {
  const {client, socket} = follow();
  const calls = [];
  client.onClientTool("get_location", async (input, waiting) => {
    calls.push([input, waiting.approval_id]);
    return {city: "Lyon"};
  });
  client.onClientTool("other_tool", () => assert.fail("not this tool's question"));
  socket.messages(LOCATING);
  await waitFor(() => socket.sent.length === 1, "the answer");
  assert.deepEqual(calls, [[{precision: "city"}, "apr_loc"]]);
  assert.deepEqual(socket.sent, [{type: "answer", approval_id: "apr_loc", answer: {city: "Lyon"}}]);

  // The connection drops before the ack: the answer may be lost, and goes again on the next socket.
  socket.serverClose(1006);
  await waitFor(() => FakeWebSocket.instances.length === 2, "the reconnect");
  const again = FakeWebSocket.last;
  again.open();
  assert.deepEqual(again.sent, [{type: "answer", approval_id: "apr_loc", answer: {city: "Lyon"}}]);
  // The replay announces the wait again, rebuilt: the handler is not called for it again.
  again.message({type: "replay.truncated", run_id: RUN, seq: 5, status: "waiting", from_step: 0});
  again.messages(LOCATING.map(({seq, ...event}, n) => ({...event, seq: 6 + n})));
  assert.equal(client.state.waiting.approval_id, "apr_loc");
  await new Promise((resolve) => setTimeout(resolve, 10));
  assert.equal(calls.length, 1, "the handler is called once per approval id");
  assert.equal(again.sent.length, 1);
  // The first answer had arrived after all: the second is refused, which is no error to report.
  again.message({type: "error", code: "already_decided", message: "answered already"});
  await flush();
  assert.deepEqual(client.state.waits, [], "refused as decided: the question is closed");
  client.close();
});

test("a client tool registered while its question is open answers it; a person's question is left to the person", async () => {
  const {client, socket} = follow();
  socket.messages([...LOCATING, {...question("apr_q", "Why?"), run_id: RUN, seq: 5}]);
  const called = [];
  client.onClientTool("ask_user", () => called.push("ask_user"));
  const off = client.onClientTool("get_location", () => {
    called.push("get_location");
    return undefined;
  });
  await waitFor(() => socket.sent.length === 1, "the answer");
  assert.deepEqual(called, ["get_location"], "a question without client=true is not a client tool's");
  assert.deepEqual(socket.sent, [{type: "answer", approval_id: "apr_loc", answer: null}], "undefined answers null");
  socket.message({type: "ack", action: "answer", approval_id: "apr_loc"});
  await waitFor(() => client.state.waits.length === 1, "the answered question to close");
  off();
  socket.message({...LOCATING[3], approval_id: "apr_loc2", seq: 6});
  await new Promise((resolve) => setTimeout(resolve, 10));
  assert.equal(socket.sent.length, 1, "a removed handler answers nothing");
  client.close();
});

test("a client tool whose handler throws sends nothing, and its error is reported, as is a refused answer", async () => {
  await reporting(async (reported) => {
    const {client, socket} = follow();
    client.onClientTool("get_location", () => {
      throw new Error("no GPS");
    });
    socket.messages(LOCATING);
    await waitFor(() => reported.length === 1, "the report");
    assert.equal(reported[0].message, "no GPS");
    await flush();
    assert.deepEqual(socket.sent, []);
    assert.equal(client.state.waiting.approval_id, "apr_loc", "the question stays open for answer()");
    client.close();
  });
  await reporting(async (reported) => {
    const {client, socket} = follow();
    client.onClientTool("get_location", async () => Promise.reject(new Error("denied by the user")));
    socket.messages(LOCATING);
    await waitFor(() => reported.length === 1, "the report");
    assert.equal(reported[0].message, "denied by the user");
    assert.deepEqual(socket.sent, []);
    client.close();
  });
  await reporting(async (reported) => {
    const {client, socket} = follow();
    client.onClientTool("get_location", () => "somewhere");
    socket.messages(LOCATING);
    await waitFor(() => socket.sent.length === 1, "the answer");
    socket.message({type: "error", code: "invalid_answer", message: "answer: Input should be a valid dictionary"});
    await waitFor(() => reported.length === 1, "the refusal's report");
    assert.equal(reported[0].code, "invalid_answer");
    assert.equal(client.state.waiting.approval_id, "apr_loc", "a refused answer leaves the question open");
    client.close();
  });
});

test("a replay of a question answered long ago does not call its client tool", async () => {
  const {client, socket} = follow();
  let calls = 0;
  client.onClientTool("get_location", () => ++calls);
  // A page opened after the answer: its socket replays the wait and, with it, the run.resume.
  socket.messages([...LOCATING,
    {type: "run.resume", run_id: RUN, seq: 5, status: "running", decision: decision("apr_loc", {city: "Lyon"}, "get_location")}]);
  await new Promise((resolve) => setTimeout(resolve, 10));
  assert.equal(calls, 0);
  assert.deepEqual(socket.sent, []);
  client.close();
});

test("a thread client answers the questions of its runs and runs their client tools", async () => {
  const client = connectThread("customer-42", base());
  const socket = FakeWebSocket.last;
  socket.open();
  client.onClientTool("get_location", (input) => ({city: "Lyon", precision: input.precision}));
  socket.messages([...TWO_QUESTIONS, ...LOCATING.map((event) => ({...event, run_id: "run_loc"}))]);
  await waitFor(() => socket.sent.length === 1, "the client tool's answer");
  assert.deepEqual(socket.sent[0], {type: "answer", approval_id: "apr_loc", answer: {city: "Lyon", precision: "city"}});
  const answered = client.answer({approvalId: "apr_colour", answer: "red"});
  const approved = client.approve("apr_x", {arguments: {amount_cents: 1}});
  assert.deepEqual(socket.sent.slice(1), [
    {type: "answer", approval_id: "apr_colour", answer: "red"},
    {type: "approve", approval_id: "apr_x", arguments: {amount_cents: 1}},
  ]);
  socket.messages([
    {type: "ack", action: "answer", approval_id: "apr_loc"},
    {type: "ack", action: "answer", approval_id: "apr_colour"},
    {type: "ack", action: "approve", approval_id: "apr_x"},
  ]);
  await answered;
  await approved;
  assert.deepEqual(ids(client.state.run(RUN)), ["apr_size"]);
  assert.deepEqual(ids(client.state.run("run_loc")), []);
  await assert.rejects(client.answer({answer: "no id"}), {code: "not_found"});
  client.close();
});
