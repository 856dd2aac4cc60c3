// The pages' scripts (run-page.js, approvals-page.js and the example chat.js of docs/chat-client.md)
// on a small fake DOM: the CSRF token they send, and what they tell the user when a request fails.
import {after, test, beforeEach} from "node:test";
import assert from "node:assert/strict";
import {copyFileSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, unlinkSync} from "node:fs";
import {tmpdir} from "node:os";
import {join} from "node:path";
import {pathToFileURL} from "node:url";

import {FakeWebSocket, RUN_ID, SAMPLE, fakeFetch, jsonResponse, numbered, waitFor} from "./fakes.mjs";
import {fakeDocument, h, withGlobals} from "./dom.mjs";

const ROOT = new URL("../../", import.meta.url);
const pageJson = (page) => h("script", {id: "chamvi-page", type: "application/json"}, JSON.stringify(page));
const csrfField = (value) => h("input", {type: "hidden", name: "csrfmiddlewaretoken", value});

beforeEach(() => FakeWebSocket.reset());

test("the run page steers over HTTP with its {% csrf_token %} where the csrftoken cookie is out of reach", async (t) => {
  // A browser without websockets, and no cookie a script may read (CSRF_COOKIE_HTTPONLY).
  const fetch = fakeFetch({
    onStream: () => new Promise(() => {}),
    onPost: () => jsonResponse(202, {id: "inp_1", run_id: RUN_ID}),
  });
  const document = fakeDocument(
    h("span", {id: "status"}, "running"), h("span", {id: "error"}), h("div", {id: "log"}), h("div", {id: "waiting"}),
    h("div", {id: "notice"}), h("ul", {id: "decisions"}, h("li", {class: "muted no-decisions"}, "none")),
    h("div", {id: "controls"}, h("form", {id: "input-form"}, h("input", {type: "text", id: "input-text"}))),
    csrfField("run-page-token"),
    pageJson({base: "/chamvi/", run_id: RUN_ID, status: "running", can_decide: false}),
  );
  t.after(withGlobals({document, fetch, WebSocket: undefined}));
  await import(new URL("chamvi_runs/static/chamvi_runs/run-page.js", ROOT));

  document.getElementById("input-text").value = "The box was damaged too.";
  document.getElementById("input-form").dispatch("submit");
  await waitFor(() => document.getElementById("notice").textContent !== "", "the page's notice");
  assert.equal(document.getElementById("notice").textContent, "Sent: the run takes it before its next model call.");
  assert.deepEqual(fetch.posts.map((p) => [p.url, p.headers["X-CSRFToken"]]), [
    [`/chamvi/api/runs/${RUN_ID}/input/`, "run-page-token"],
  ]);
});

test("the approvals page decides in place with its form's CSRF token where the cookie is out of reach", async (t) => {
  const fetch = fakeFetch({onPost: () => jsonResponse(200, {approval_id: "apr_9XkQ", decision: "approved"})});
  const approve = h("button", {name: "action", value: "approve"}, "Approve");
  const form = h("form", {method: "post"},
    csrfField("approvals-token"),
    h("input", {type: "hidden", name: "approval_id", value: "apr_9XkQ"}),
    h("input", {type: "text", name: "reason", value: "photos checked"}),
    approve, h("button", {name: "action", value: "deny"}, "Deny"));
  const row = h("tr", {class: "approval", "data-approval-id": "apr_9XkQ", "data-run-id": RUN_ID, "data-tool-name": "issue_refund"},
    h("td", {}, form));
  const document = fakeDocument(h("h1", {}, "Waiting runs"), h("table", {}, row), pageJson({base: "/chamvi/"}));
  t.after(withGlobals({document, fetch}));
  await import(new URL("chamvi_runs/static/chamvi_runs/approvals-page.js", ROOT));

  const submit = form.dispatch("submit", {submitter: approve});
  assert.equal(submit.defaultPrevented, true);
  await waitFor(() => document.querySelector("ul.messages"), "the page's message");
  assert.equal(document.querySelector("ul.messages").textContent, `Approved: issue_refund of run ${RUN_ID}.`);
  assert.equal(document.querySelector("tr.approval"), null, "the decided row is gone");
  assert.equal(document.querySelector("table"), null, "and its table with the last row");
  assert.equal(document.querySelector("p.empty").textContent,
    "Every approval on this page is decided: reload it for those still waiting.");
  assert.deepEqual(fetch.posts.map((p) => [p.url, p.body, p.headers["X-CSRFToken"]]), [
    ["/chamvi/api/approvals/apr_9XkQ/approve/", {reason: "photos checked"}, "approvals-token"],
  ]);
});

/** The run page (templates/chamvi_runs/run.html) following its run over Server-Sent Events, as a
    browser without websockets does; `fetch` answers its commands. The module is imported afresh. */
let runPages = 0;
async function openRunPage(t, fetch) {
  const document = fakeDocument(
    h("span", {id: "status"}, "running"), h("span", {id: "error"}), h("div", {id: "log"}), h("div", {id: "waiting"}),
    h("div", {id: "notice"}), h("ul", {id: "decisions"}, h("li", {class: "muted no-decisions"}, "none")),
    h("div", {id: "controls"},
      h("form", {id: "input-form"}, h("input", {type: "text", id: "input-text"})), h("button", {id: "cancel"})),
    csrfField("run-page-token"),
    pageJson({base: "/chamvi/", run_id: RUN_ID, status: "running", can_decide: false}),
  );
  t.after(withGlobals({document, fetch, WebSocket: undefined}));
  runPages += 1;
  await import(new URL(`chamvi_runs/static/chamvi_runs/run-page.js?page=${runPages}`, ROOT));
  await waitFor(() => fetch.streams.length === 1, "the page's stream");
  return document;
}

const notice = (document) => document.getElementById("notice").textContent;
const END = {output: null, error: null, usage: {input_tokens: 1, output_tokens: 1}, inputs: [], decisions: []};

test("the run page's notice of a requested cancel goes once the run has ended, and the cut text is marked", async (t) => {
  const fetch = fakeFetch({onPost: (url) => (url.endsWith("/cancel/") ? {id: RUN_ID, status: "running"} : {})});
  const document = await openRunPage(t, fetch);
  const [stream] = fetch.streams;
  stream.events(numbered(RUN_ID, 1, [
    {type: "run.start", status: "running"},
    {type: "step.start", step: 0, attempt: 1},
    {type: "delta", step: 0, attempt: 1, kind: "text", text: "I am writing a long "},
  ]));
  await waitFor(() => document.getElementById("log").textContent === "I am writing a long ", "the text so far");
  document.getElementById("cancel").dispatch("click");
  await waitFor(() => notice(document) !== "", "the page's notice");
  assert.equal(notice(document), "Cancel requested (the run is running).");
  stream.events(numbered(RUN_ID, 4, [{type: "run.end", status: "cancelled", ...END}]));
  await waitFor(() => document.getElementById("status").textContent === "cancelled", "the run's end");
  assert.equal(notice(document), "", "no longer news: the status says it");
  assert.equal(document.querySelector("#log .cut").textContent, "— stopped: the run was cancelled");
  assert.equal(document.querySelector("#log .text").textContent, "I am writing a long ");
});

test("the run page's notice of a message sent goes once the run takes it, or says the run ended first", async (t) => {
  let inputs = 0;
  const fetch = fakeFetch({onPost: () => jsonResponse(202, {id: `inp_${++inputs}`, run_id: RUN_ID})});
  const document = await openRunPage(t, fetch);
  const [stream] = fetch.streams;
  stream.events(numbered(RUN_ID, 1, [{type: "run.start", status: "running"}]));
  const send = async (text) => {
    document.getElementById("input-text").value = text;
    document.getElementById("input-form").dispatch("submit");
    await waitFor(() => notice(document) !== "", "the page's notice");
    assert.equal(notice(document), "Sent: the run takes it before its next model call.");
  };
  await send("Use express shipping.");
  stream.events(numbered(RUN_ID, 2, [{type: "input", step: 0, input_id: "inp_1", payload: "Use express shipping."}]));
  await waitFor(() => notice(document) === "", "the notice to go once the conversation shows the message");
  await send("And gift-wrap it.");
  stream.events(numbered(RUN_ID, 3, [{type: "run.end", status: "completed", ...END}]));
  await waitFor(() => document.getElementById("status").textContent === "completed", "the run's end");
  assert.equal(notice(document), "The run ended before it took your message.");
});

test("a model's answer that stopped before its end is marked with why", async (t) => {
  t.after(withGlobals({document: fakeDocument()}));
  const {Conversation} = await import(new URL("chamvi_runs/static/chamvi_runs/render.js", ROOT));
  const message = (finish_reason) => ({kind: "message", step: 0, attempt: 1, text: "The answer is forty", reasoning: "", finish_reason});
  const ended = (status, code) => ({status, error: code ? {code, message: "x"} : null});
  const cases = [
    [message("stop"), null, null],
    [message("tool_calls"), ended("cancelled"), null],
    [message(null), null, null],  // still streaming
    [message("length"), ended("completed"), "— cut off: the answer reached the model's length limit"],
    [message("content_filter"), ended("completed"), "— cut off by the provider's content filter"],
    [message("error"), ended("failed", "model_error"), "— stopped: the model call failed"],
    [message(null), ended("failed", "incomplete_response"), "— cut off: the model's answer stopped before its end"],
    [message(null), ended("failed", "timeout"), "— stopped: the run failed"],
    [message(null), ended("cancelled"), "— stopped: the run was cancelled"],
  ];
  for (const [item, end, mark] of cases) {
    const log = h("div", {id: "log"});
    new Conversation(log).render({items: [item], end});
    assert.equal(log.querySelector(".cut")?.textContent ?? null, mark, JSON.stringify([item.finish_reason, end]));
  }
});

// chat.js imports "../chamvi_runs/client.js" as the site's static files lay it out: a copy of it
// beside a link to the app's static directory.
const chatDir = mkdtempSync(join(tmpdir(), "chamvi-chat-"));
mkdirSync(join(chatDir, "example"));
copyFileSync(new URL("project/static/example/chat.js", ROOT), join(chatDir, "example", "chat.js"));
symlinkSync(new URL("chamvi_runs/static/chamvi_runs", ROOT).pathname, join(chatDir, "chamvi_runs"));
after(() => {
  unlinkSync(join(chatDir, "chamvi_runs"));  // the link only, before the copy's directory goes
  rmSync(chatDir, {recursive: true});
});
let chats = 0;

/** Opens the example chat page (templates/example/chat.html) with `fetch`; returns its document. */
async function openChat(t, fetch) {
  const document = fakeDocument(h("main", {id: "chat", "data-agent": "support", "data-api": "/chamvi/api/runs/"},
    h("p", {id: "connection"}),
    h("div", {id: "conversation"}),
    h("div", {id: "approval", hidden: ""},
      h("span", {id: "approval-tool"}), h("pre", {id: "approval-input"}), h("input", {id: "approval-reason"}),
      h("button", {id: "approve"}), h("button", {id: "deny"})),
    h("form", {id: "composer"}, csrfField("chat-token"), h("input", {id: "message"}), h("button", {id: "stop", hidden: ""})),
    h("p", {id: "notice"})));
  const location = {protocol: "http:", host: "example.test", search: "?thread=chat-1"};
  t.after(withGlobals({document, fetch, location, WebSocket: FakeWebSocket}));
  chats += 1;
  await import(`${pathToFileURL(join(chatDir, "example", "chat.js"))}?page=${chats}`);
  return document;
}

async function send(document, text) {
  document.getElementById("message").value = text;
  document.getElementById("composer").dispatch("submit");
  await waitFor(() => document.getElementById("notice").textContent !== "", "the page's notice");
  return document.getElementById("notice").textContent;
}

test("the chat page reports a message refused by Django's CSRF check (an HTML 403) with its HTTP status", async (t) => {
  const fetch = fakeFetch({
    onPost: () => new Response("<h1>Forbidden <span>(403)</span></h1>", {status: 403, statusText: "Forbidden"}),
  });
  const document = await openChat(t, fetch);
  assert.equal(await send(document, "hello"), "http_403: Forbidden");
  assert.equal(fetch.posts[0].headers["X-CSRFToken"], "chat-token");
});

test("the chat page reports a refusal whose JSON has no error field with its HTTP status", async (t) => {
  const fetch = fakeFetch({
    onPost: () => new Response(JSON.stringify({detail: "no"}), {status: 400, statusText: "Bad Request"}),
  });
  const document = await openChat(t, fetch);
  assert.equal(await send(document, "hello"), "http_400: Bad Request");
});

test("the chat page reports an earlier run whose details cannot be fetched", async (t) => {
  const fetch = fakeFetch({onStream: () => jsonResponse(404, {error: {code: "not_found", message: "no such run"}})});
  const document = await openChat(t, fetch);
  const socket = FakeWebSocket.last;
  socket.open();
  socket.message(SAMPLE[0]);
  await waitFor(() => document.getElementById("notice").textContent !== "", "the page's notice");
  assert.equal(document.getElementById("notice").textContent, "not_found: no such run");
  assert.equal(fetch.gets[0].url, `/chamvi/api/runs/${RUN_ID}/`);
  socket.serverClose(4403);  // ends the page's client, and its timers
});
