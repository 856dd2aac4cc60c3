// Fakes for client.js under `node --test`: a WebSocket the test drives, a fetch whose Server-Sent
// Events bodies the test writes chunk by chunk, and event sequences as the server sends them.
import {readFileSync} from "node:fs";

export const LOCATION = {protocol: "http:", host: "example.test"};

/** A WebSocket whose other end is the test. The client calls the constructor, send() and close();
    the test plays the server with open(), message(obj), serverClose(code) and refuse(). */
export class FakeWebSocket {
  static CONNECTING = 0;
  static OPEN = 1;
  static CLOSING = 2;
  static CLOSED = 3;
  static instances = [];

  static reset() {
    FakeWebSocket.instances = [];
  }

  static get last() {
    return FakeWebSocket.instances.at(-1);
  }

  constructor(url, protocols = []) {
    this.url = url;
    this.protocols = protocols;
    this.readyState = FakeWebSocket.CONNECTING;
    this.sent = [];
    this.clientClose = null;  // the code the client closed with, if it did
    this.onopen = this.onmessage = this.onclose = this.onerror = null;
    FakeWebSocket.instances.push(this);
  }

  /** The `after` of the URL the client connected with. */
  get after() {
    return new URL(this.url).searchParams.get("after");
  }

  /** A thread client's `resume` (run_id:seq,…), or null. */
  get resume() {
    return new URL(this.url).searchParams.get("resume");
  }

  send(data) {
    // A browser throws on a socket that is not open yet: a client that sends early must fail here.
    if (this.readyState !== FakeWebSocket.OPEN) throw new Error(`send() on a socket in state ${this.readyState}`);
    this.sent.push(JSON.parse(data));
  }

  close(code = 1005, reason = "") {
    if (this.readyState >= FakeWebSocket.CLOSING) return;
    this.clientClose = code;
    this.readyState = FakeWebSocket.CLOSING;
    // As in a browser, onclose comes later, not inside close().
    queueMicrotask(() => this._closed(code, reason));
  }

  open() {
    this.readyState = FakeWebSocket.OPEN;
    this.onopen?.({type: "open"});
  }

  /** The server sends `obj` (JSON-encoded; a string is sent as is). */
  message(obj) {
    if (this.readyState !== FakeWebSocket.OPEN) throw new Error("message() on a socket that is not open");
    this.onmessage?.({type: "message", data: typeof obj === "string" ? obj : JSON.stringify(obj)});
  }

  messages(list) {
    for (const obj of list) this.message(obj);
  }

  /** The server (or the network) ends the connection with `code`. */
  serverClose(code = 1006, reason = "") {
    this._closed(code, reason);
  }

  /** A handshake that fails: the socket never opens. */
  refuse() {
    this.onerror?.({type: "error"});
    this._closed(1006, "");
  }

  _closed(code, reason) {
    if (this.readyState === FakeWebSocket.CLOSED) return;
    this.readyState = FakeWebSocket.CLOSED;
    this.onclose?.({type: "close", code, reason, wasClean: code === 1000});
  }
}

/** A Server-Sent Events body the test writes: push(text) sends a chunk, end() ends the stream.
    Aborting the request's signal errors it, as a browser's fetch does. */
export class SseBody {
  constructor(signal) {
    this.encoder = new TextEncoder();
    this.ended = false;
    this.stream = new ReadableStream({
      start: (controller) => {
        this.controller = controller;
      },
    });
    signal?.addEventListener("abort", () => {
      this.aborted = true;
      if (!this.ended) this.controller.error(new DOMException("The operation was aborted.", "AbortError"));
      this.ended = true;
    });
  }

  push(chunk) {
    if (this.ended) throw new Error("push() on an ended stream");
    this.controller.enqueue(typeof chunk === "string" ? this.encoder.encode(chunk) : chunk);
  }

  events(list) {
    for (const event of list) this.push(sseFrame(event));
  }

  end() {
    if (this.ended) return;
    this.ended = true;
    this.controller.close();
  }
}

/** One frame as chamvi_runs' stream view writes it. */
export function sseFrame(event) {
  return `id: ${event.seq}\nevent: ${event.type}\ndata: ${JSON.stringify(event)}\n\n`;
}

export function jsonResponse(status, body) {
  return new Response(JSON.stringify(body), {status, headers: {"Content-Type": "application/json"}});
}

/** A fetch that records each request and answers GETs of a stream with a new SseBody (in
    `streams`) and POSTs with `onPost(url, body, init)` (a Response, or a value sent as 200 JSON).
    `onStream(url, init)` may answer a stream request itself with a Response. */
export function fakeFetch({onPost = () => ({}), onStream = null} = {}) {
  const fetch = async (url, init = {}) => {
    const request = {url: String(url), init, method: init.method || "GET", headers: init.headers || {}};
    fetch.requests.push(request);
    if (request.method === "POST") {
      request.body = init.body ? JSON.parse(init.body) : null;
      fetch.posts.push(request);
      const answer = await onPost(request.url, request.body, init);
      return answer instanceof Response ? answer : jsonResponse(200, answer);
    }
    fetch.gets.push(request);
    const answered = onStream && (await onStream(request.url, init));
    if (answered) return answered;
    const body = new SseBody(init.signal);
    fetch.streams.push(body);
    request.stream = body;
    return new Response(body.stream, {status: 200, headers: {"Content-Type": "text/event-stream"}});
  };
  fetch.requests = [];
  fetch.gets = [];
  fetch.posts = [];
  fetch.streams = [];
  return fetch;
}

/** Waits (a few ms at most, real timers) until `predicate()` is true; fails the test otherwise. */
export async function waitFor(predicate, what = "the condition", timeout = 1000) {
  const start = Date.now();
  while (!predicate()) {
    if (Date.now() - start > timeout) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setImmediate(resolve));
  }
}

/** Settles a promise into {ok, value} or {ok: false, error}, with a handler attached at once, so a
    rejection the test checks later is never reported as unhandled. */
export function outcome(promise) {
  const result = {done: false};
  result.promise = promise.then(
    (value) => Object.assign(result, {done: true, ok: true, value}),
    (error) => Object.assign(result, {done: true, ok: false, error}),
  );
  return result;
}

export const flush = () => new Promise((resolve) => setImmediate(resolve));

// --- recorded event sequences --------------------------------------------------------------

/** A JSON sample of the docs (`<!-- sample: NAME -->`): tests/integration/test_docs_samples.py checks that the
    server sends events of exactly these shapes, so feeding them here feeds what the server sends. */
export function docSample(name) {
  const text = readFileSync(new URL("../../docs/streaming.md", import.meta.url), "utf8");
  const match = text.match(new RegExp(`<!-- sample: ${name} -->\\s*\`\`\`json\\n([\\s\\S]*?)\`\`\``));
  if (!match) throw new Error(`no sample ${name} in docs/streaming.md`);
  return JSON.parse(match[1]);
}

/** The docs' run: asks for an approval, is approved, takes an input, completes (seq 1..18). */
export const SAMPLE = docSample("streaming-events");
export const RUN_ID = SAMPLE[0].run_id;
export const bySeq = (from, to) => SAMPLE.filter((e) => e.seq >= from && e.seq <= to);
/** The sample up to and including its run.waiting. */
export const UNTIL_WAITING = SAMPLE.slice(0, SAMPLE.findIndex((e) => e.type === "run.waiting") + 1);
/** The fields of the sample's waiting object besides those the tests name: an approval's, whether the
    sample's run.waiting carries them (this release) or not (a server before questions). */
export const APPROVAL_DEFAULTS = (({kind = "approval", tool_call_id = null, question = null, answer_schema = null, client = false, editable = false}) => (
  {kind, tool_call_id, question, answer_schema, client, editable}
))(UNTIL_WAITING.at(-1));

/** Numbers `events` (objects without run_id/seq) as one run's events from `first`. */
export function numbered(runId, first, events) {
  return events.map((event, n) => ({type: event.type, run_id: runId, seq: first + n, ...event}));
}

/** A run whose model call of step 2 crashed after streaming part of its text and starting a tool
    call; the recovered execution announces the step's input again and retries it as attempt 2,
    while a late delta of attempt 1 still comes through. */
export const RETRIED = numbered("run_retry", 1, [
  {type: "run.start", status: "running"},
  {type: "step.start", step: 0, attempt: 1},
  {type: "delta", step: 0, attempt: 1, kind: "text", text: "Checking."},
  {type: "step.end", step: 0, attempt: 1, finish_reason: "tool_calls"},
  {type: "tool.call", step: 1, tool_call_id: "call_a", name: "lookup_order", input: {order_id: "A-7"}},
  {type: "tool.result", step: 1, tool_call_id: "call_a", name: "lookup_order", output: {total_cents: 100}},
  {type: "input", step: 2, input_id: "inp_1", payload: "hurry please"},
  {type: "step.start", step: 2, attempt: 1},
  {type: "delta", step: 2, attempt: 1, kind: "reasoning", text: "The user is in a hurry"},
  {type: "delta", step: 2, attempt: 1, kind: "text", text: "I will refund the wh"},
  {type: "step.end", step: 2, attempt: 1, finish_reason: "tool_calls"},
  {type: "tool.call", step: 3, tool_call_id: "call_b", name: "issue_refund", input: {amount_cents: 100}},
  // seq 13..: the lease was lost; another worker runs the run again.
  {type: "run.resume", status: "running"},
  {type: "input", step: 2, input_id: "inp_1", payload: "hurry please"},
  {type: "step.start", step: 2, attempt: 2},
  {type: "delta", step: 2, attempt: 1, kind: "text", text: "ole order."},  // late, from the old worker
  {type: "delta", step: 2, attempt: 2, kind: "text", text: "Refunding 1.00 now."},
  {type: "step.end", step: 2, attempt: 2, finish_reason: "stop"},
  {type: "run.end", status: "completed", output: "Refunding 1.00 now.", error: null,
    usage: {input_tokens: 50, output_tokens: 9}, inputs: ["inp_1"], decisions: []},
]);

/** A short run of a thread: starts, answers in two deltas, completes. */
export function shortRun(runId, answer, {first = 1} = {}) {
  const half = Math.ceil(answer.length / 2);
  return numbered(runId, first, [
    {type: "run.start", status: "running"},
    {type: "step.start", step: 0, attempt: 1},
    {type: "delta", step: 0, attempt: 1, kind: "text", text: answer.slice(0, half)},
    {type: "delta", step: 0, attempt: 1, kind: "text", text: answer.slice(half)},
    {type: "step.end", step: 0, attempt: 1, finish_reason: "stop"},
    {type: "run.end", status: "completed", output: answer, error: null,
      usage: {input_tokens: 5, output_tokens: 5}, inputs: [], decisions: []},
  ]);
}

/** Interleaves lists: one of each in turn. */
export function interleave(...lists) {
  const out = [];
  for (let n = 0; n < Math.max(...lists.map((l) => l.length)); n++) {
    for (const list of lists) if (n < list.length) out.push(list[n]);
  }
  return out;
}

/** The text a page shows: the items as short lines. */
export function transcript(state) {
  return state.items.map((item) => {
    switch (item.kind) {
      case "message": return `message ${item.step}#${item.attempt}: ${item.text}`;
      case "tool": return `tool ${item.step} ${item.name}${item.done ? " done" : ""}`;
      case "input": return `input ${item.input_id}: ${JSON.stringify(item.payload)}`;
      case "decision": return `decision ${item.approval_id}: ${item.decision}`;
      default: return `? ${item.kind}`;
    }
  });
}

export const fastBackoff = () => ({initial: 1, max: 4, random: () => 0});

// What the docs' sample run shows once it has ended: the transcript() of its state.
export const SAMPLE_TRANSCRIPT = [
  "message 0#1: Let me look that order up.",
  "tool 1 lookup_order done",
  "message 2#1: A colleague has to approve the refund.",
  "decision apr_9XkQ: approved",
  "tool 4 issue_refund done",
  'input inp_4fT8: "The box was damaged too."',
  "message 5#2: Done: the refund is issued.",
];
