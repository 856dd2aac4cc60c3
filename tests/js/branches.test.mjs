// Regenerate, resend, forks and a thread's branches (issue 19, SPEC §12): the branch rule, run.start's
// lineage in the state, the commands over the socket and over HTTP, and replays that keep the branch.
import {test, beforeEach} from "node:test";
import assert from "node:assert/strict";

import {
  RunState, ThreadState, connectRun, connectThread, currentBranch, regenerateRun, resendRun,
} from "../../chamvi_runs/static/chamvi_runs/client.js";
import {
  FakeWebSocket, LOCATION, fakeFetch, fastBackoff, flush, jsonResponse, numbered, outcome, shortRun, waitFor,
} from "./fakes.mjs";

const base = () => ({WebSocket: FakeWebSocket, location: LOCATION, backoff: fastBackoff()});

beforeEach(() => FakeWebSocket.reset());

/** A short run of a thread whose run.start says its place, as a server of this release sends it. */
function run(runId, answer, {replaces = null, forked_from = null, replaced_by = null, first = 1} = {}) {
  const events = shortRun(runId, answer, {first});
  events[0] = {...events[0], replaces, replaced_by, forked_from};
  return events;
}

/** A ThreadState fed `lists` of events, one after the other. */
function thread(...lists) {
  const state = new ThreadState("chat-1");
  for (const event of lists.flat()) state.apply(event);
  return state;
}

const shown = (state, options) => state.list(options).map((r) => r.run_id);
const texts = (state) => state.list().map((r) => r.message(0)?.text ?? "");

/** A run's summary as the HTTP API answers a regenerate or a resend: 201 with the new run. */
const runJson = (id, replaces) => ({id, agent: "support", status: "queued", replaces, replaced_by: null, forked_from: null});

/** A thread client whose socket is open; `told` records the run ids of its listeners' calls. */
function followThread(options = {}) {
  const client = connectThread("chat-1", {...base(), ...options});
  const socket = FakeWebSocket.last;
  socket.open();
  const told = {run: [], change: [], event: [], branch: []};
  client.on("run", (state) => told.run.push(state.run_id));
  client.on("change", (state) => told.change.push(state.run_id));
  client.on("event", (event) => told.event.push(event.run_id));
  client.on("branch", (branch) => told.branch.push(branch.join(",")));
  return {client, socket, told};
}

// --- the rule ------------------------------------------------------------------------------------

test("the branch rule: plain runs, regenerate, resend, forks, runs of other threads", () => {
  const plain = (...ids) => ids.map((id) => ({id}));
  assert.deepEqual(currentBranch([]), []);
  assert.deepEqual(currentBranch(plain("a", "b", "c")), ["a", "b", "c"]);
  assert.deepEqual(currentBranch([...plain("a", "b", "c"), {id: "c2", replaces: "c"}]), ["a", "b", "c2"]);
  assert.deepEqual(currentBranch([...plain("a", "b"), {id: "b2", replaces: "b"}, {id: "c"}]), ["a", "b2", "c"]);
  assert.deepEqual(currentBranch([...plain("a", "b", "c", "d"), {id: "b2", replaces: "b"}]), ["a", "b2"]);
  assert.deepEqual(currentBranch([{id: "a"}, {id: "a2", replaces: "a"}]), ["a2"]);
  assert.deepEqual(currentBranch([...plain("a", "b"), {id: "b2", replaces: "b"}, {id: "b3", replaces: "b"}]), ["a", "b3"]);
  assert.deepEqual(currentBranch([...plain("a", "b"), {id: "b2", replaces: "b"}, {id: "b3", replaces: "b2"}]), ["a", "b3"]);
  const fork = (run_id, step) => ({run_id, step});
  assert.deepEqual(currentBranch([...plain("a", "b", "c"), {id: "f", forked_from: fork("b", 3)}]), ["a", "b", "f"]);
  assert.deepEqual(currentBranch([...plain("a", "b", "c"), {id: "f", forked_from: fork("b", -1)}]), ["a", "f"]);
  assert.deepEqual(currentBranch([...plain("a", "b"), {id: "f", forked_from: fork("elsewhere", 0)}]), ["f"]);
  assert.deepEqual(currentBranch([...plain("a", "b"), {id: "c", replaces: "elsewhere"}]), ["a", "b", "c"]);
  // RunStates (run_id) read as run JSON (id) does.
  const states = ["a", "b"].map((id) => new RunState(id));
  states[1].replaces = "a";
  assert.deepEqual(currentBranch(states), ["b"]);
  // Not a thread the store makes, but the walk ends.
  assert.deepEqual(currentBranch([{id: "a", forked_from: fork("b", 0)}, {id: "b", forked_from: fork("a", 0)}]), ["a", "b"]);
});

// --- run.start's fields in the state ------------------------------------------------------------

test("run.start's replaces, replaced_by and forked_from reach the run's state; a rebuild keeps them", () => {
  const state = new RunState("run_b2");
  assert.deepEqual([state.replaces, state.replaced_by, state.forked_from], [null, null, null]);
  const events = run("run_b2", "Again.", {replaces: "run_b"});
  for (const event of events) state.apply(event);
  assert.equal(state.replaces, "run_b");
  assert.equal(state.replaced_by, null);
  // A rebuild of the run once something replaced it: run.start says by what.
  state.apply({type: "replay.truncated", run_id: "run_b2", seq: 7, status: "completed", from_step: 0});
  assert.equal(state.replaces, "run_b", "the marker empties the events, not the run's place");
  state.apply({...events[0], seq: 8, replaced_by: "run_b3"});
  assert.equal(state.replaced_by, "run_b3");
  // The live run.start of a replay says null: it does not unsay what the rebuild said.
  state.apply({type: "replay.truncated", run_id: "run_b2", seq: 9, status: "completed", from_step: 0});
  state.apply({...events[0], seq: 10});
  assert.equal(state.replaced_by, "run_b3");

  const fork = new RunState("run_f");
  fork.apply(run("run_f", "Forked.", {forked_from: {run_id: "run_a", step: 2}})[0]);
  assert.deepEqual(fork.forked_from, {run_id: "run_a", step: 2});
  // A server of a release before branches: nothing to say, nothing said.
  const old = new RunState("run_old");
  old.apply(shortRun("run_old", "x")[0]);
  assert.deepEqual([old.replaces, old.replaced_by, old.forked_from], [null, null, null]);
});

// --- the branch of a thread's state ---------------------------------------------------------------

test("a regenerate of the latest run takes its place: the old answer leaves the branch and names its replacement", () => {
  const state = thread(run("run_a", "Hi."), run("run_b", "Blue."), run("run_b2", "Green.", {replaces: "run_b"}));
  assert.deepEqual(state.branch, ["run_a", "run_b2"]);
  assert.deepEqual(texts(state), ["Hi.", "Green."]);
  assert.deepEqual(shown(state, {allBranches: true}), ["run_a", "run_b", "run_b2"]);
  assert.equal(state.run("run_b").replaced_by, "run_b2");
  assert.equal(state.onBranch("run_b"), false);
  assert.deepEqual(state.runsOnBranch().map((r) => r.run_id), ["run_a", "run_b2"]);
  // The thread goes on from the new answer.
  state.apply(run("run_c", "Sure.")[0]);
  assert.deepEqual(state.branch, ["run_a", "run_b2", "run_c"]);
});

test("a resend of an earlier run hides every run after it", () => {
  const state = thread(
    run("run_a", "Hi."), run("run_b", "Blue."), run("run_c", "Sure."), run("run_a2", "Hello!", {replaces: "run_a"}),
  );
  assert.deepEqual(state.branch, ["run_a2"]);
  assert.deepEqual(shown(state), ["run_a2"]);
  assert.deepEqual(shown(state, {allBranches: true}), ["run_a", "run_b", "run_c", "run_a2"]);
  assert.equal(state.run("run_a").replaced_by, "run_a2");
  assert.equal(state.run("run_b").replaced_by, null, "left the branch, replaced by nothing");
});

test("a regenerate of a run off the branch switches back to the branch it was on", () => {
  const state = thread(
    run("run_a", "Hi."), run("run_b", "Blue."), run("run_a2", "Hello!", {replaces: "run_a"}),
  );
  assert.deepEqual(state.branch, ["run_a2"]);
  // b is off the branch; answering it again goes on from a, where b started.
  state.apply(run("run_b2", "Red.", {replaces: "run_b"})[0]);
  assert.deepEqual(state.branch, ["run_a", "run_b2"]);
  assert.deepEqual(shown(state), ["run_a", "run_b2"]);
});

test("a fork inside the thread goes on from the run (or the start of the run) it names", () => {
  const after = thread(
    run("run_a", "Hi."), run("run_b", "Blue."), run("run_c", "Sure."),
    run("run_f", "Forked.", {forked_from: {run_id: "run_b", step: 1}}),
  );
  assert.deepEqual(after.branch, ["run_a", "run_b", "run_f"]);
  const fromStart = thread(
    run("run_a", "Hi."), run("run_b", "Blue."), run("run_c", "Sure."),
    run("run_f", "Forked.", {forked_from: {run_id: "run_b", step: -1}}),
  );
  assert.deepEqual(fromStart.branch, ["run_a", "run_f"]);
  assert.equal(fromStart.run("run_b").replaced_by, null, "a fork replaces nothing");
  const elsewhere = thread(run("run_a", "Hi."), run("run_f", "Forked.", {forked_from: {run_id: "run_x", step: 0}}));
  assert.deepEqual(elsewhere.branch, ["run_f"]);
});

test("the same run replaced twice names the newest replacement, whatever order a rebuild says it in", () => {
  const state = thread(
    run("run_a", "Hi."), run("run_b2", "Green.", {replaces: "run_a"}), run("run_b3", "Red.", {replaces: "run_a"}),
  );
  assert.equal(state.run("run_a").replaced_by, "run_b3");
  // A rebuild of a, made when the server knew of a newer replacement than the client has seen.
  const rebuilt = thread(
    run("run_a", "Hi.", {replaced_by: "run_b4"}), run("run_b2", "Green.", {replaces: "run_a"}),
  );
  assert.equal(rebuilt.run("run_a").replaced_by, "run_b4");
});

// --- the commands ----------------------------------------------------------------------------------

test("a thread's regenerate goes over the socket; by the ack the new run is queued on the branch", async () => {
  const {client, socket, told} = followThread();
  socket.messages([...run("run_a", "Hi."), ...run("run_b", "Blue.")]);
  assert.deepEqual(told.branch, ["run_a", "run_a,run_b"]);
  const regenerated = client.regenerate({runId: "run_b"});
  assert.deepEqual(socket.sent, [{type: "regenerate", run_id: "run_b"}]);
  socket.message({type: "ack", action: "regenerate", run_id: "run_b2", replaces: "run_b"});
  assert.deepEqual(await regenerated, {type: "ack", action: "regenerate", run_id: "run_b2", replaces: "run_b"});
  assert.deepEqual(client.state.branch, ["run_a", "run_b2"]);
  assert.equal(client.state.run("run_b2").status, "queued");
  assert.equal(client.state.run("run_b").replaced_by, "run_b2");
  assert.deepEqual(told.run, ["run_a", "run_b", "run_b2"]);
  assert.equal(told.branch.at(-1), "run_a,run_b2");
  assert.deepEqual(client.runs().map((r) => r.run_id), ["run_a", "run_b2"]);

  // The socket streams the new run; its run.start changes nothing more of the branch.
  const branches = told.branch.length;
  socket.messages(run("run_b2", "Green.", {replaces: "run_b"}));
  assert.equal(told.branch.length, branches);
  assert.equal(client.state.run("run_b2").message(0).text, "Green.");
  assert.deepEqual([...client.state.runs.keys()], ["run_a", "run_b", "run_b2"]);
  client.close();
});

test("an ack that comes after the new run's first events adds nothing twice", async () => {
  const {client, socket, told} = followThread();
  socket.messages([...run("run_a", "Hi."), ...run("run_b", "Blue.")]);
  const resent = client.resend({runId: "run_a", payload: {message: "Hello?"}});
  assert.deepEqual(socket.sent, [{type: "resend", run_id: "run_a", payload: {message: "Hello?"}}]);
  socket.messages([
    ...run("run_a2", "Hello!", {replaces: "run_a"}).slice(0, 2),
    {type: "ack", action: "resend", run_id: "run_a2", replaces: "run_a"},
  ]);
  assert.equal((await resent).run_id, "run_a2");
  assert.deepEqual(told.run, ["run_a", "run_b", "run_a2"]);
  assert.deepEqual(client.state.branch, ["run_a2"]);
  assert.equal(client.state.run("run_a2").status, "running");
  client.close();
});

test("a thread client tells its listeners of the current branch only, unless allBranches", async () => {
  // b is still running when c forks from a: b leaves the branch and its events go untold.
  const fork = run("run_f", "Forked.", {forked_from: {run_id: "run_a", step: 0}});
  const b = run("run_b", "Blue, then more.");
  const feed = (socket) => socket.messages([...run("run_a", "Hi."), ...b.slice(0, 3), ...fork, ...b.slice(3)]);

  const {client, socket, told} = followThread();
  feed(socket);
  assert.deepEqual(client.state.branch, ["run_a", "run_f"]);
  assert.equal(told.event.filter((id) => id === "run_b").length, 3, "b's events after the fork are not told");
  assert.equal(client.state.run("run_b").ended, true, "the state still takes them");
  // A fork after a step of b goes on from b: b comes back, told as it is now.
  const changes = told.change.length;
  socket.messages(run("run_g", "From b.", {forked_from: {run_id: "run_b", step: 1}}).slice(0, 1));
  assert.deepEqual(client.state.branch, ["run_a", "run_b", "run_g"]);
  assert.deepEqual(told.change.slice(changes), ["run_g", "run_b"]);
  assert.equal(client.state.run("run_b").message(0).text, "Blue, then more.");
  // Resending g goes on from where g started, b: g leaves the branch.
  const resent = client.resend({runId: "run_g", payload: "again"});
  socket.message({type: "ack", action: "resend", run_id: "run_g2", replaces: "run_g"});
  await resent;
  assert.deepEqual(client.state.branch, ["run_a", "run_b", "run_g2"]);
  assert.deepEqual(told.run, ["run_a", "run_b", "run_f", "run_g", "run_g2"]);
  client.close();

  const every = followThread({allBranches: true});
  feed(every.socket);
  assert.equal(every.told.event.filter((id) => id === "run_b").length, b.length);
  assert.deepEqual(every.told.run, ["run_a", "run_b", "run_f"]);
  assert.deepEqual(every.client.runs().map((r) => r.run_id), ["run_a", "run_b", "run_f"]);
  every.client.close();
});

test("a thread's regenerate or resend names its run; a resend's payload is JSON", async () => {
  const {client, socket} = followThread();
  await assert.rejects(client.regenerate({}), {code: "invalid_message"});
  await assert.rejects(client.resend({payload: "x"}), {code: "invalid_message"});
  await assert.rejects(client.resend({runId: "run_a"}), {code: "invalid_message"});
  await assert.rejects(client.resend({runId: "run_a", payload: 1n}), {code: "invalid_message"});
  assert.deepEqual(socket.sent, []);
  const refused = client.regenerate({runId: "run_a"});
  socket.message({type: "error", code: "run_active", message: "run run_a is running"});
  await assert.rejects(refused, {code: "run_active"});
  assert.equal(client.state.runs.size, 0);
  client.close();
});

test("a run client regenerates its run over the socket while it is open, and marks it replaced", async () => {
  const client = connectRun("run_b", base());
  const socket = FakeWebSocket.last;
  socket.open();
  const events = run("run_b", "Blue.");
  socket.messages(events.slice(0, 3));
  const changes = [];
  client.on("change", (state) => changes.push(state.replaced_by));
  // Refused by the server while the run is active; sent without run_id, as input and cancel are.
  const early = client.regenerate();
  assert.deepEqual(socket.sent, [{type: "regenerate"}]);
  socket.message({type: "error", code: "run_active", message: "run run_b is running"});
  await assert.rejects(early, {code: "run_active"});
  const resent = client.resend({payload: "Make it red."});
  assert.deepEqual(socket.sent.at(-1), {type: "resend", payload: "Make it red."});
  socket.message({type: "ack", action: "resend", run_id: "run_b2", replaces: "run_b"});
  assert.deepEqual(await resent, {type: "ack", action: "resend", run_id: "run_b2", replaces: "run_b"});
  assert.equal(client.state.replaced_by, "run_b2");
  assert.deepEqual(changes, ["run_b2"]);
  client.close();
});

test("a run client whose run has ended regenerates over HTTP; another run's too", async () => {
  const fetch = fakeFetch({
    onPost(url, body) {
      if (url.includes("/run_busy/")) return jsonResponse(409, {error: {code: "run_active", message: "busy"}});
      return jsonResponse(201, runJson(url.includes("/resend/") ? "run_b3" : "run_b2", url.split("/").at(-3)));
    },
  });
  const client = connectRun("run_b", {...base(), fetch, csrfToken: "tok-1"});
  const socket = FakeWebSocket.last;
  socket.open();
  socket.messages(run("run_b", "Blue."));
  await flush();
  assert.equal(socket.readyState, FakeWebSocket.CLOSED, "the run ended: the socket is gone");
  const replies = [];
  client.on("reply", (reply) => replies.push(reply.action ?? reply.code));

  const regenerated = await client.regenerate();
  assert.deepEqual(regenerated, {type: "ack", action: "regenerate", run_id: "run_b2", replaces: "run_b"});
  assert.deepEqual([fetch.posts[0].url, fetch.posts[0].body], ["/chamvi/api/runs/run_b/regenerate/", {}]);
  assert.equal(fetch.posts[0].headers["X-CSRFToken"], "tok-1");
  assert.equal(client.state.replaced_by, "run_b2");
  const resent = await client.resend({payload: {message: "Red?"}});
  assert.equal(resent.run_id, "run_b3");
  assert.deepEqual([fetch.posts[1].url, fetch.posts[1].body], ["/chamvi/api/runs/run_b/resend/", {payload: {message: "Red?"}}]);
  assert.equal(client.state.replaced_by, "run_b3");
  // Another run of the thread, named: over HTTP, and this run is not marked.
  await assert.rejects(client.regenerate({runId: "run_busy"}), {code: "run_active", status: 409});
  assert.equal(client.state.replaced_by, "run_b3");
  assert.deepEqual(replies, ["regenerate", "resend", "run_active"]);
  // close() stops them as it stops every command.
  client.close();
  await assert.rejects(client.regenerate(), {code: "closed"});
  assert.equal(fetch.posts.length, 3);
});

test("over Server-Sent Events, regenerate and resend are HTTP requests", async () => {
  const fetch = fakeFetch({onPost: (url) => jsonResponse(201, runJson("run_b2", "run_b"))});
  const client = connectRun("run_b", {WebSocket: null, fetch, location: LOCATION, backoff: fastBackoff(), csrfToken: ""});
  await waitFor(() => fetch.streams.length === 1, "the stream");
  fetch.streams[0].events(run("run_b", "Blue.").slice(0, 2));
  const pending = outcome(client.regenerate());
  await pending.promise;
  assert.deepEqual(pending.value, {type: "ack", action: "regenerate", run_id: "run_b2", replaces: "run_b"});
  assert.equal(fetch.posts[0].url, "/chamvi/api/runs/run_b/regenerate/");
  client.close();
});

test("regenerateRun and resendRun start the new run over HTTP and resolve with its JSON", async () => {
  const fetch = fakeFetch({
    onPost(url, body) {
      if (url.includes("run_gone")) return jsonResponse(404, {error: {code: "not_found", message: "no run run_gone"}});
      if (url.includes("run_old")) return jsonResponse(409, {error: {code: "history_unavailable", message: "no step"}});
      return jsonResponse(201, runJson("run_new", "run_b"));
    },
  });
  const regenerated = await regenerateRun("run_b", {fetch, csrfToken: "tok-9", base: "/x/"});
  assert.equal(regenerated.id, "run_new");
  assert.equal(regenerated.replaces, "run_b");
  assert.deepEqual([fetch.posts[0].url, fetch.posts[0].body], ["/x/api/runs/run_b/regenerate/", {}]);
  assert.equal(fetch.posts[0].headers["X-CSRFToken"], "tok-9");
  await resendRun("run_b", "edited", {fetch, token: "chv_1"});
  assert.deepEqual(fetch.posts[1].body, {payload: "edited"});
  assert.equal(fetch.posts[1].headers.Authorization, "Bearer chv_1");
  await assert.rejects(regenerateRun("run_gone", {fetch}), {code: "not_found", status: 404});
  await assert.rejects(resendRun("run_old", "x", {fetch}), {code: "history_unavailable", status: 409});
  await assert.rejects(resendRun("run_b", undefined, {fetch}), {code: "invalid_message"});
  await assert.rejects(resendRun("run_b", {n: 1n}, {fetch}), {code: "invalid_message"});
  assert.equal(fetch.posts.length, 4, "a payload that is not JSON sends nothing");
});

// --- replays ---------------------------------------------------------------------------------------

test("a rebuild (replay.truncated, then the run from its steps) keeps the branch", async () => {
  const {client, socket, told} = followThread();
  const b2 = run("run_b2", "Green.", {replaces: "run_b"});
  socket.messages([...run("run_a", "Hi."), ...run("run_b", "Blue."), ...b2]);
  assert.deepEqual(client.state.branch, ["run_a", "run_b2"]);

  // The socket drops; the server lost the buffers: each run comes again as a rebuild.
  socket.serverClose(1006);
  await waitFor(() => FakeWebSocket.instances.length === 2, "the reconnect");
  const again = FakeWebSocket.last;
  again.open();
  const rebuild = (events, seq, extra = {}) => [
    {type: "replay.truncated", run_id: events[0].run_id, seq, status: "completed", from_step: 0},
    ...events.map((e, n) => ({...e, ...(n === 0 ? extra : {}), seq: seq + 1 + n})),
  ];
  const branches = told.branch.length;
  again.messages([
    ...rebuild(run("run_a", "Hi."), 7),
    ...rebuild(run("run_b", "Blue."), 7, {replaced_by: "run_b2"}),
    ...rebuild(b2, 7),
  ]);
  assert.deepEqual(client.state.branch, ["run_a", "run_b2"]);
  assert.equal(told.branch.length, branches, "the branch never moved");
  assert.equal(client.state.run("run_b").replaced_by, "run_b2");
  assert.equal(client.state.run("run_b2").replaces, "run_b");
  assert.deepEqual(client.runs().map((r) => r.message(0).text), ["Hi.", "Green."]);
  client.close();
});

test("a page opened after the regenerate is shown the replaced run until its replacement comes", () => {
  // The thread socket replays runs oldest first: b is the newest run until b2's events come.
  const state = new ThreadState("chat-1");
  for (const event of [...run("run_a", "Hi."), ...run("run_b", "Blue.", {replaced_by: "run_b2"})]) state.apply(event);
  assert.deepEqual(state.branch, ["run_a", "run_b"]);
  for (const event of run("run_b2", "Green.", {replaces: "run_b"})) state.apply(event);
  assert.deepEqual(state.branch, ["run_a", "run_b2"]);
});
