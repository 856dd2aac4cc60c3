// The Server-Sent Events fallback, read with a fake fetch: frames, resumes, commands as HTTP POSTs.
import {test, beforeEach} from "node:test";
import assert from "node:assert/strict";

import {
  ChamviError, connectRun, connectThread, decideApproval,
} from "../../chamvi_runs/static/chamvi_runs/client.js";
import {withGlobals} from "./dom.mjs";
import {
  FakeWebSocket, LOCATION, SAMPLE, RUN_ID, UNTIL_WAITING, bySeq, sseFrame, fakeFetch, jsonResponse, transcript,
  fastBackoff, outcome, flush, waitFor,
} from "./fakes.mjs";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

beforeEach(() => FakeWebSocket.reset());

function followSse(fetch, options = {}) {
  const client = connectRun(RUN_ID, {
    WebSocket: null, fetch, location: LOCATION, backoff: fastBackoff(), csrfToken: "tok-123", ...options,
  });
  const changes = [];
  client.on("connection", (change) => changes.push(change));
  return {client, changes, statuses: () => changes.map((c) => c.status)};
}

/** Splits `text`'s UTF-8 bytes into chunks of `size` bytes (cutting characters in two). */
function byteChunks(text, size) {
  const bytes = new TextEncoder().encode(text);
  const chunks = [];
  for (let n = 0; n < bytes.length; n += size) chunks.push(bytes.slice(n, n + size));
  return chunks;
}

test("without websockets the client reads the SSE stream: frames split anywhere, comments skipped", async () => {
  const fetch = fakeFetch();
  const {client} = followSse(fetch, {headers: {Authorization: "Bearer k"}});
  assert.equal(client.transport, "sse");
  await waitFor(() => fetch.gets.length === 1, "the stream request");
  const request = fetch.gets[0];
  assert.equal(request.url, "/chamvi/api/runs/run_2bq0/stream/?after=0");
  assert.equal(request.headers.Accept, "text/event-stream");
  assert.equal(request.headers.Authorization, "Bearer k");
  assert.equal(request.init.credentials, "same-origin");
  await waitFor(() => client.connection === "open", "the stream to open");

  const events = bySeq(1, 8).map((e) => (e.type === "delta" && e.step === 0 ? {...e, text: "Prüfe die Bestellung… ✓"} : e));
  const text = ": stream of run_2bq0\n\n" + events.map(sseFrame).join("").replace(sseFrame(events[4]), (frame) => `${frame}: keepalive\n\n`);
  for (const chunk of byteChunks(text, 7)) request.stream.push(chunk);
  await waitFor(() => client.state.last_seq === 8, "the events to be read");
  assert.equal(client.state.message(0).text, "Prüfe die Bestellung… ✓");
  assert.deepEqual(transcript(client.state), [
    "message 0#1: Prüfe die Bestellung… ✓",
    "tool 1 lookup_order done",
    "message 2#1: A colleague has to approve the refund.",
  ]);
  client.close();
  assert.equal(request.stream.aborted, true, "close() aborts the request");
});

test("CRLF line ends and a data field split over several lines are read as one event", async () => {
  const fetch = fakeFetch();
  const {client} = followSse(fetch);
  await waitFor(() => fetch.streams.length === 1, "the stream");
  const body = fetch.streams[0];
  const json = JSON.stringify(SAMPLE[0], null, 1).split("\n");
  body.push(`id: 1\r\nevent: run.start\r\n${json.map((l) => `data: ${l}`).join("\r\n")}\r\n\r\n`);
  body.push(`id: 2\nevent: step.start\ndata:${JSON.stringify(SAMPLE[1])}\n`);
  await flush();
  assert.equal(client.state.last_seq, 1, "a frame is taken at its blank line, not before");
  body.push("\n");
  await waitFor(() => client.state.last_seq === 2, "the second event");
  assert.equal(client.state.status, "running");
  client.close();
});

test("a stream that ends without run.end is resumed with ?after=<last seq> until run.end", async () => {
  const fetch = fakeFetch();
  const {client, statuses} = followSse(fetch);
  await waitFor(() => fetch.streams.length === 1, "the stream");
  fetch.streams[0].events(bySeq(1, 10));
  fetch.streams[0].end();
  await waitFor(() => fetch.streams.length === 2, "the resumed stream");
  assert.equal(fetch.gets[1].url, "/chamvi/api/runs/run_2bq0/stream/?after=10");
  assert.equal(client.state.status, "waiting");
  // The resumed stream overlaps what was read: nothing is shown twice.
  fetch.streams[1].events(bySeq(9, 18));
  await waitFor(() => client.connection === "closed", "the client to close after run.end");
  assert.equal(transcript(client.state).length, 7);
  assert.equal(client.state.message(2).text, "A colleague has to approve the refund.");
  assert.equal(client.state.status, "completed");
  assert.equal(fetch.streams[1].aborted, true);
  await sleep(10);
  assert.equal(fetch.gets.length, 2, "no stream after run.end");
  assert.deepEqual(statuses(), ["open", "reconnecting", "connecting", "open", "closed"]);
});

test("a stream cut by the network is resumed too", async () => {
  const fetch = fakeFetch();
  const {client} = followSse(fetch);
  await waitFor(() => fetch.streams.length === 1, "the stream");
  fetch.streams[0].events(bySeq(1, 3));
  await waitFor(() => client.state.last_seq === 3, "three events");
  fetch.streams[0].controller.error(new TypeError("network error"));
  await waitFor(() => fetch.streams.length === 2, "the resumed stream");
  assert.equal(fetch.gets[1].url.endsWith("?after=3"), true);
  client.close();
});

test("a refused stream (404 with the API's error body) closes the client with that error", async () => {
  const fetch = fakeFetch({onStream: () => jsonResponse(404, {error: {code: "not_found", message: "no such run"}})});
  const {client, changes} = followSse(fetch);
  await waitFor(() => client.connection === "closed", "the client to give up");
  const last = changes.at(-1);
  assert.equal(last.code, "not_found");
  assert.ok(last.error instanceof ChamviError);
  assert.deepEqual([client.error.code, client.error.message, client.error.status], ["not_found", "no such run", 404]);
  await sleep(10);
  assert.equal(fetch.gets.length, 1);
  await assert.rejects(client.input("x"), {code: "not_found", status: 404});
  assert.equal(fetch.posts.length, 0);
});

test("a server error or a failed request on the stream is retried", async () => {
  let calls = 0;
  const fetch = fakeFetch({
    onStream: () => {
      calls += 1;
      if (calls === 1) return new Response("<h1>Bad gateway</h1>", {status: 502, statusText: "Bad Gateway"});
      if (calls === 2) throw new TypeError("Failed to fetch");
      return null;
    },
  });
  const {client, changes} = followSse(fetch);
  await waitFor(() => fetch.streams.length === 1, "a stream after two failures");
  assert.equal(calls, 3);
  assert.deepEqual(changes.filter((c) => c.status === "reconnecting").map((c) => c.code), [502, undefined]);
  fetch.streams[0].events(bySeq(1, 2));
  await waitFor(() => client.state.last_seq === 2, "events");
  client.close();
});

test("over SSE, commands are HTTP POSTs with the CSRF token, resolved as acks", async () => {
  const fetch = fakeFetch({
    onPost(url, body) {
      if (url.endsWith("/input/")) return jsonResponse(202, {id: "inp_4fT8", run_id: RUN_ID});
      if (url.endsWith("/cancel/")) return jsonResponse(202, {id: RUN_ID, status: "running", cancel_requested: true});
      return jsonResponse(200, {approval_id: "apr_9XkQ", decision: "approved", reason: body.reason});
    },
  });
  const {client} = followSse(fetch);
  const replies = [];
  client.on("reply", (reply) => replies.push(reply));
  await waitFor(() => fetch.streams.length === 1, "the stream");
  fetch.streams[0].events(UNTIL_WAITING);
  await waitFor(() => client.state.waiting !== null, "the wait");

  assert.deepEqual(await client.input("The box was damaged too."), {type: "ack", action: "input", input_id: "inp_4fT8"});
  assert.deepEqual(await client.approve({reason: "photos checked"}), {type: "ack", action: "approve", approval_id: "apr_9XkQ"});
  assert.deepEqual(await client.cancel(), {type: "ack", action: "cancel", status: "running"});
  assert.deepEqual(fetch.posts.map((p) => [p.url, p.body]), [
    ["/chamvi/api/runs/run_2bq0/input/", {payload: "The box was damaged too."}],
    ["/chamvi/api/approvals/apr_9XkQ/approve/", {reason: "photos checked"}],
    ["/chamvi/api/runs/run_2bq0/cancel/", {}],
  ]);
  for (const post of fetch.posts) {
    assert.equal(post.headers["X-CSRFToken"], "tok-123");
    assert.equal(post.headers["Content-Type"], "application/json");
    assert.equal(post.init.credentials, "same-origin");
  }
  assert.deepEqual(replies.map((r) => r.action), ["input", "approve", "cancel"]);
  client.close();
});

test("with an API token, the stream and the commands send it as a bearer token", async () => {
  const fetch = fakeFetch({onPost: () => jsonResponse(202, {id: "inp_1", run_id: RUN_ID})});
  const {client} = followSse(fetch, {token: "chv_s3cret", csrfToken: "", base: "https://example.test/chamvi/"});
  await waitFor(() => fetch.streams.length === 1, "the stream");
  assert.equal(fetch.gets[0].url, "https://example.test/chamvi/api/runs/run_2bq0/stream/?after=0");
  assert.equal(fetch.gets[0].headers.Authorization, "Bearer chv_s3cret");
  fetch.streams[0].events(bySeq(1, 3));
  await waitFor(() => client.state.last_seq === 3, "the events");
  assert.deepEqual(await client.input("hi"), {type: "ack", action: "input", input_id: "inp_1"});
  assert.equal(fetch.posts[0].headers.Authorization, "Bearer chv_s3cret");
  assert.equal(fetch.posts[0].headers["X-CSRFToken"], undefined);
  client.close();
});

test("over SSE, a restart (a marker below the seq taken) starts the page over; the next stream resumes by it", async () => {
  const fetch = fakeFetch();
  const {client} = followSse(fetch, {after: 7});
  await waitFor(() => fetch.streams.length === 1, "the stream");
  // The server no longer knows seq 7: the run from its start, behind a marker at 0.
  fetch.streams[0].events([
    {type: "replay.truncated", run_id: RUN_ID, seq: 0, status: "running", from_step: 0},
    ...bySeq(1, 3),
  ]);
  await waitFor(() => client.state.last_seq === 3, "the restart");
  assert.deepEqual(transcript(client.state), ["message 0#1: Let me look that order up."]);
  fetch.streams[0].end();
  await waitFor(() => fetch.streams.length === 2, "the next stream");
  assert.ok(fetch.gets[1].url.endsWith("?after=3"));
  client.close();
});

test("over SSE, an HTTP refusal rejects with the API's code, message and status", async () => {
  const fetch = fakeFetch({
    onPost(url) {
      if (url.endsWith("/approve/")) return jsonResponse(409, {error: {code: "already_decided", message: "it was decided already"}});
      if (url.endsWith("/deny/")) return jsonResponse(410, {error: {code: "expired", message: "the approval expired"}});
      return new Response("oops", {status: 500, statusText: "Internal Server Error"});
    },
  });
  const csrf = [];
  const {client} = followSse(fetch, {csrfToken: () => { csrf.push("asked"); return "fresh"; }});
  const replies = [];
  client.on("reply", (reply) => replies.push(reply));
  const approve = outcome(client.approve({approvalId: "apr_1"}));
  const deny = outcome(client.deny({approvalId: "apr_2", reason: "no"}));
  const input = outcome(client.input("x"));
  await Promise.all([approve.promise, deny.promise, input.promise]);
  assert.ok(approve.error instanceof ChamviError);
  assert.deepEqual([approve.error.code, approve.error.message, approve.error.status], ["already_decided", "it was decided already", 409]);
  assert.deepEqual([deny.error.code, deny.error.status], ["expired", 410]);
  assert.deepEqual([input.error.code, input.error.message, input.error.status], ["http_500", "Internal Server Error", 500]);
  assert.deepEqual(replies.map((r) => [r.type, r.code]).sort(), [["error", "already_decided"], ["error", "expired"], ["error", "http_500"]]);
  assert.equal(fetch.posts[0].headers["X-CSRFToken"], "fresh", "the token is read when the command is sent");
  assert.equal(csrf.length, 3);
  client.close();
});

test("over SSE, a POST that cannot reach the server rejects with connection_lost", async () => {
  const fetch = fakeFetch({onPost: () => { throw new TypeError("Failed to fetch"); }});
  const {client} = followSse(fetch);
  await assert.rejects(client.input("x"), {code: "connection_lost", status: null});
  client.close();
});

test("auto: after 3 websockets that never opened, the client goes on over SSE from the last seq", async () => {
  const fetch = fakeFetch();
  const client = connectRun(RUN_ID, {WebSocket: FakeWebSocket, fetch, location: LOCATION, backoff: fastBackoff(), after: 4});
  const transports = [];
  client.on("connection", (change) => transports.push(`${change.transport}:${change.status}`));
  for (let n = 1; n <= 3; n++) {
    await waitFor(() => FakeWebSocket.instances.length === n, `socket ${n}`);
    assert.equal(FakeWebSocket.last.after, "4");
    FakeWebSocket.last.refuse();
  }
  await waitFor(() => fetch.gets.length === 1, "the SSE request");
  assert.equal(FakeWebSocket.instances.length, 3);
  assert.equal(client.transport, "sse");
  assert.equal(fetch.gets[0].url, "/chamvi/api/runs/run_2bq0/stream/?after=4");
  await waitFor(() => client.connection === "open", "the SSE stream to open");
  // The third failure goes to SSE at once, without another websocket delay.
  assert.deepEqual(transports, [
    "websocket:reconnecting", "websocket:connecting",
    "websocket:reconnecting", "websocket:connecting",
    "sse:connecting", "sse:open",
  ]);
  fetch.streams[0].events(bySeq(5, 6));
  await waitFor(() => client.state.last_seq === 6, "the SSE events");
  await sleep(10);
  assert.equal(FakeWebSocket.instances.length, 3, "no more websockets once on SSE");
  client.close();
});

test("auto: once a websocket has opened, a page that loses its network keeps reconnecting over websockets", async () => {
  const fetch = fakeFetch();
  const client = connectRun(RUN_ID, {WebSocket: FakeWebSocket, fetch, location: LOCATION, backoff: fastBackoff()});
  FakeWebSocket.last.refuse();
  await waitFor(() => FakeWebSocket.instances.length === 2, "socket 2");
  FakeWebSocket.last.refuse();
  await waitFor(() => FakeWebSocket.instances.length === 3, "socket 3");
  FakeWebSocket.last.open();
  FakeWebSocket.last.serverClose(1006);
  // The wifi is gone: socket after socket never opens.
  for (let n = 4; n <= 8; n++) {
    await waitFor(() => FakeWebSocket.instances.length === n, `socket ${n}`);
    FakeWebSocket.last.refuse();
  }
  await waitFor(() => FakeWebSocket.instances.length === 9, "socket 9");
  assert.equal(client.transport, "websocket");
  assert.equal(fetch.gets.length, 0, "no switch to Server-Sent Events for good");
  client.close();
});

test("auto: a command queued while websockets fail is sent over HTTP once on SSE", async () => {
  const fetch = fakeFetch({onPost: () => jsonResponse(202, {id: "inp_1", run_id: RUN_ID})});
  const client = connectRun(RUN_ID, {WebSocket: FakeWebSocket, fetch, location: LOCATION, backoff: fastBackoff(), commandTimeout: 50});
  const queued = outcome(client.input("sent before the fallback"));
  try {
    for (let n = 1; n <= 3; n++) {
      await waitFor(() => FakeWebSocket.instances.length === n, `socket ${n}`);
      FakeWebSocket.last.refuse();
    }
    await waitFor(() => client.transport === "sse", "the fallback");
    await waitFor(() => queued.done || fetch.posts.length > 0, "the command to be sent or settled", 300);
    assert.deepEqual(fetch.posts.map((p) => p.body), [{payload: "sent before the fallback"}]);
    await queued.promise;
    assert.equal(queued.ok, true, queued.error?.message);
  } finally {
    client.close();
  }
});

/** A fetch whose POSTs the server never answers; a POST's request fails once its signal aborts. */
function unanswered() {
  return fakeFetch({
    onPost: (url, body, init) => new Promise((resolve, reject) => {
      init.signal?.addEventListener("abort", () => reject(new DOMException("The operation was aborted.", "AbortError")));
    }),
  });
}

test("over SSE, a command the server does not answer rejects with timeout and its request is aborted", async () => {
  const fetch = unanswered();
  const {client} = followSse(fetch, {commandTimeout: 20});
  const replies = [];
  client.on("reply", (reply) => replies.push(reply));
  const input = outcome(client.input("x"));
  await waitFor(() => input.done, "the command to give up", 500);
  assert.ok(input.error instanceof ChamviError);
  assert.equal(input.error.code, "timeout");
  assert.equal(fetch.posts[0].init.signal.aborted, true, "the request is not left running");
  assert.deepEqual(replies, [], "the client's own timeout is no reply of the server");
  client.close();
});

test("over SSE, close() rejects commands still on their way with closed, also after the run ended", async () => {
  const fetch = unanswered();
  const {client} = followSse(fetch);
  await waitFor(() => fetch.streams.length === 1, "the stream");
  const early = outcome(client.input("x"));
  client.close();
  await waitFor(() => early.done, "the command to be rejected", 500);
  assert.equal(early.error.code, "closed");
  assert.equal(fetch.posts[0].init.signal.aborted, true);

  const {client: ended} = followSse(fetch);
  await waitFor(() => fetch.streams.length === 2, "the second client's stream");
  const late = outcome(ended.cancel());
  fetch.streams[1].events(SAMPLE);
  await waitFor(() => ended.state.ended, "run.end");
  ended.close();
  await waitFor(() => late.done, "the command to be rejected after run.end", 500);
  assert.equal(late.error.code, "closed");
});

test("an option given as undefined keeps its default: csrfToken: undefined still sends the cookie's token", async (t) => {
  const restore = withGlobals({document: {cookie: "sessionid=s; csrftoken=from-cookie"}});
  t.after(restore);
  const fetch = fakeFetch({onPost: () => jsonResponse(202, {id: "inp_1", run_id: RUN_ID})});
  const {client} = followSse(fetch, {csrfToken: undefined});
  await client.input("x");
  assert.equal(fetch.posts[0].headers["X-CSRFToken"], "from-cookie");
  client.close();
});

test("close() while the stream request is on its way: its late answer opens, reports and retries nothing", async () => {
  const answers = {
    refused: () => jsonResponse(404, {error: {code: "not_found", message: "no such run"}}),
    "server error": () => new Response("<h1>Bad gateway</h1>", {status: 502}),
    accepted: () => null,
  };
  for (const [name, answer] of Object.entries(answers)) {
    let release;
    const gate = new Promise((resolve) => { release = resolve; });
    const fetch = fakeFetch({onStream: () => gate.then(answer)});
    const {client, statuses} = followSse(fetch);
    await waitFor(() => fetch.gets.length === 1, "the stream request");
    client.close();
    release();
    await sleep(10);
    assert.deepEqual(statuses(), ["closed"], name);
    assert.equal(client.error, undefined, name);
    assert.equal(fetch.gets.length, 1, name);
  }
});

test("a listener that closes the client gets no more events, not even those of the same chunk", async () => {
  const fetch = fakeFetch();
  const {client} = followSse(fetch);
  const seen = [];
  client.on("event", (event) => {
    seen.push(event.seq);
    if (event.seq === 2) client.close();
  });
  await waitFor(() => fetch.streams.length === 1, "the stream");
  fetch.streams[0].push(bySeq(1, 5).map(sseFrame).join(""));
  await sleep(10);
  assert.deepEqual(seen, [1, 2]);
  assert.equal(client.state.last_seq, 2);
});

test("a stream that stayed open 5 s reconnects at the shortest delay again; one cut at once waits longer", async (t) => {
  t.mock.timers.enable({apis: ["setTimeout"]});
  const fetch = fakeFetch();
  const {client, changes} = followSse(fetch, {backoff: {initial: 100, max: 10000, random: () => 1}});
  const delays = () => changes.filter((c) => c.status === "reconnecting").map((c) => c.delay);
  for (let n = 1; n <= 3; n++) {
    await waitFor(() => client.connection === "open", `stream ${n} to open`);
    fetch.streams.at(-1).end();
    await waitFor(() => client.connection === "reconnecting", `stream ${n} to end`);
    t.mock.timers.tick(changes.at(-1).delay);
  }
  assert.deepEqual(delays(), [100, 200, 400]);
  await waitFor(() => client.connection === "open", "stream 4 to open");
  t.mock.timers.tick(5000);
  fetch.streams.at(-1).end();
  await waitFor(() => client.connection === "reconnecting", "stream 4 to end");
  assert.deepEqual(delays(), [100, 200, 400, 100]);
  client.close();
});

test("a thread has no SSE stream: without websockets the client closes with unsupported", async () => {
  const thread = connectThread("customer-42", {WebSocket: null, fetch: fakeFetch(), location: LOCATION});
  assert.equal(thread.connection, "closed");
  assert.equal(thread.error.code, "unsupported");
  await assert.rejects(thread.input("run_a", "x"), {code: "unsupported"});
});

test("transport sse uses SSE even where websockets exist", async () => {
  const fetch = fakeFetch();
  const client = connectRun(RUN_ID, {WebSocket: FakeWebSocket, fetch, location: LOCATION, transport: "sse", base: "/app/chamvi/"});
  await waitFor(() => fetch.gets.length === 1, "the stream");
  assert.equal(fetch.gets[0].url, "/app/chamvi/api/runs/run_2bq0/stream/?after=0");
  assert.equal(FakeWebSocket.instances.length, 0);
  client.close();
});

test("decideApproval decides over HTTP with the notifier's token, and rejects a refusal with its status", async () => {
  const fetch = fakeFetch({
    onPost(url, body) {
      if (body.token === "stale") return jsonResponse(410, {error: {code: "expired", message: "the approval expired"}});
      return jsonResponse(200, {approval_id: "apr_1", decision: "denied", reason: body.reason});
    },
  });
  const decided = await decideApproval("apr_1", "deny", {reason: "too much", token: "t0k", fetch, csrfToken: ""});
  assert.equal(decided.decision, "denied");
  assert.deepEqual([fetch.posts[0].url, fetch.posts[0].body], ["/chamvi/api/approvals/apr_1/deny/", {reason: "too much", token: "t0k"}]);
  assert.equal("X-CSRFToken" in fetch.posts[0].headers, false, "no empty CSRF header");
  await assert.rejects(decideApproval("apr_1", "approve", {token: "stale", fetch}), {code: "expired", status: 410});
  await assert.rejects(decideApproval("apr_1", "maybe", {fetch}), {code: "invalid_message"});
  assert.equal(fetch.posts.length, 2);
});

test("decideApproval gives up after commandTimeout: the request is aborted and rejects with timeout", async () => {
  let signal = null;
  // A server that never answers: only the abort ends the request, as in a browser.
  const fetch = (url, init) => new Promise((resolve, reject) => {
    signal = init.signal;
    signal.addEventListener("abort", () => reject(new DOMException("The operation was aborted.", "AbortError")));
  });
  await assert.rejects(decideApproval("apr_1", "approve", {fetch, commandTimeout: 20, csrfToken: ""}), {code: "timeout"});
  assert.equal(signal.aborted, true);
});
