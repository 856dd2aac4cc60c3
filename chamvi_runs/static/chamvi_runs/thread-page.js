/* The thread page (templates/chamvi_runs/thread.html): the runs of the thread's current branch,
   live, also the runs started while the page is open, and the questions they ask, answered in
   place. A settled run's message can be edited and sent again (Edit) and its answer asked for again
   (Regenerate): the thread goes on from the new run, and the runs it leaves behind are listed apart
   and shown in place on demand ("Show replaced runs"). Approvals are decided on each run's page. */
import {TERMINAL_STATUSES, connectThread} from "./client.js";
import {Conversation, asText, editForm, editableMessage, el, onAnswers, questionBox, sameJson} from "./render.js";

const page = JSON.parse(document.getElementById("chamvi-page").textContent);
const $ = (id) => document.getElementById(id);
const container = $("thread-runs");
const runUrl = $("run-url").getAttribute("href");
const runLink = (runId) => runUrl.replace("RUN_ID", encodeURIComponent(runId));
const views = new Map();  // run id -> {section, conversation, canAnswer, seenOpen, filled}
// Where a run goes among the others: the server's order of the thread's runs, then the order the
// page learns of newer ones (the socket replays a thread's runs oldest first).
const order = new Map(page.order.map((id, n) => [id, n]));
// The branch the server drew: what the page shows of a run until the socket has told of it.
const drawnOnBranch = new Set(page.branch);

function viewOf(section) {
  // Whether the viewer may answer the run's questions: the server says for the runs it drew; a run
  // started later shows its forms, and the server refuses an answer it may not give.
  const canAnswer = section.dataset.canAnswer !== "false";
  const filled = section.dataset.payload !== undefined;
  return {section, conversation: new Conversation(section.querySelector(".log")), canAnswer, seenOpen: new Set(), filled};
}

for (const section of container.querySelectorAll(".thread-run")) views.set(section.dataset.runId, viewOf(section));

function actionButton(action, label) {
  const button = el("button", action === "edit" ? "edit-message" : "regenerate", label);
  button.type = "button";
  button.dataset.action = action;
  return button;
}

function newRun(runId) {
  const section = el("section", "thread-run");
  section.dataset.runId = runId;
  const message = el("div", "message");
  message.append(el("div", "bubble input trigger-message"));
  const status = el("p", "muted", "Status: ");
  const link = el("a", "run-link", runId);
  link.href = runLink(runId);
  status.append(el("span", "status run-status", "queued"), " ", el("span", "run-error"), " · ", link);
  const parts = [message, el("div", "log"), el("div", "run-waiting")];
  // Edit and Regenerate for a run started later: the server says whether the viewer may (may_again).
  if (page.may_again) {
    const edit = el("div", "message-actions");
    edit.append(actionButton("edit", "Edit"));
    message.append(edit);
    const actions = el("div", "run-actions");
    const error = el("span", "branch-error");
    error.setAttribute("role", "alert");
    actions.append(actionButton("regenerate", "Regenerate"), " ", error);
    parts.push(actions);
  }
  section.append(...parts, status);
  if (!order.has(runId)) order.set(runId, order.size);
  const at = order.get(runId);
  const next = [...container.children].find((other) => (order.get(other.dataset.runId) ?? -1) > at);
  container.insertBefore(section, next ?? null);
  $("no-runs")?.remove();
  return viewOf(section);
}

const client = connectThread(page.thread, {base: page.base, scope: page.scope, allBranches: true});

client.on("change", (state) => {
  let view = views.get(state.run_id);
  if (!view) views.set(state.run_id, (view = newRun(state.run_id)));
  const {section, conversation} = view;
  conversation.render(state);
  if (state.status) section.querySelector(".run-status").textContent = state.status;
  const error = state.end?.error;
  section.querySelector(".run-error").textContent = error ? `${error.code}: ${error.message}` : "";
  drawWaits(view, state);
  showBranch();
});
client.on("branch", showBranch);

/* The run's open wait points in its section: a question with its form, an approval as a pointer to
   the run's page. A box goes once the run's events show it closed; one the server drew stays
   through the replay until the replay has it. */
function drawWaits({section, canAnswer, seenOpen}, state) {
  const holder = section.querySelector(".run-waiting");
  // The run's open wait points, and its child runs' (delegation).
  const open = new Map((state.allWaits ? state.allWaits() : state.waits || []).map((w) => [w.approval_id, w]));
  const decided = new Set(state.decisions.map((d) => d.approval_id));
  for (const id of open.keys()) seenOpen.add(id);
  for (const box of holder.querySelectorAll(".wait")) {
    const id = box.dataset.approvalId;
    if (state.ended || decided.has(id) || (seenOpen.has(id) && !open.has(id))) box.remove();
  }
  const shown = new Set([...holder.querySelectorAll(".wait")].map((box) => box.dataset.approvalId));
  for (const waiting of open.values()) {
    if (shown.has(waiting.approval_id)) continue;
    if (waiting.kind === "input") {
      holder.append(questionBox(waiting, {canAnswer}));
    } else {
      const box = el("div", "bubble approval wait", "Waiting for approval of ");
      box.dataset.approvalId = waiting.approval_id;
      box.dataset.kind = "approval";
      box.append(el("strong", "", waiting.tool_name), ": decide on the run page.");
      holder.append(box);
    }
  }
}

onAnswers(container, (approvalId, answer) => client.answer({approvalId, answer}));

// --- the current branch -----------------------------------------------------------------------------

function onBranch(runId) {
  return client.state.runs.has(runId) ? client.state.onBranch(runId) : drawnOnBranch.has(runId);
}

/* Shows the runs of the current branch (and, on demand, the others, marked), keeps the list of the
   runs left behind, and enables Edit and Regenerate while no run of the thread is active. */
function showBranch() {
  const all = $("show-replaced").checked;
  for (const [runId, view] of views) {
    const kept = onBranch(runId);
    view.section.classList.toggle("replaced", !kept);
    view.section.hidden = !kept && !all;
    markReplaced(view, kept ? null : client.state.run(runId));
    if (!view.section.hidden) fill(view);
  }
  listReplaced();
  enableActions();
}

function markReplaced({section}, state) {
  let mark = section.querySelector(".replaced-mark");
  if (!state) {
    mark?.remove();
    return;
  }
  if (!mark) section.prepend((mark = el("p", "replaced-mark muted")));
  const by = state.replaced_by;
  if (mark.dataset.by === (by ?? "")) return;
  mark.dataset.by = by ?? "";
  if (by) {
    const link = el("a", "", by);
    link.href = runLink(by);
    mark.replaceChildren("Replaced by ", link);
  } else {
    mark.replaceChildren("Replaced: an earlier run was regenerated or edited, and the thread goes on without this one.");
  }
}

// The list of the runs left behind: those the server listed, and those the socket tells of.
function listReplaced() {
  const list = $("replaced-runs");
  const items = new Map([...list.children].map((li) => [li.dataset.runId, li]));
  for (const [runId, li] of items) if (onBranch(runId)) li.remove();
  for (const state of client.state.runs.values()) {
    if (onBranch(state.run_id)) continue;
    let li = items.get(state.run_id);
    if (!li) {
      li = el("li");
      li.dataset.runId = state.run_id;
      const link = el("a", "replaced-link", state.run_id);
      link.href = runLink(state.run_id);
      li.append(link);
      list.append(li);
    }
    if (state.replaced_by && !li.querySelector(".replaced-by")) {
      const by = el("a", "replaced-by", state.replaced_by);
      by.href = runLink(state.replaced_by);
      li.append(" · replaced by ", by);
    }
  }
  $("replaced-count").textContent = String(list.children.length);
  $("replaced").hidden = list.children.length === 0;
}

$("show-replaced").addEventListener("change", showBranch);

/* A section the page drew itself gets the run's message (and what it replaces or was forked from)
   from the run's JSON, once it is shown. */
async function fill(view) {
  if (view.filled) return;
  view.filled = true;
  const runId = view.section.dataset.runId;
  let response;
  try {
    response = await fetch(`${page.base}api/runs/${encodeURIComponent(runId)}/`, {credentials: "same-origin"});
  } catch {
    view.filled = false;  // the network's: the next change asks again
    return;
  }
  // A refusal stays one: the section shows the run's conversation without its message.
  const run = response.ok ? await response.json().catch(() => null) : null;
  if (!run) return;
  const payload = run.trigger?.payload;
  view.section.dataset.payload = JSON.stringify(payload ?? null);
  view.section.querySelector(".trigger-message").textContent = asText(payload);
  const notes = lineage(run, payload);
  if (notes && !view.section.querySelector(".lineage")) view.section.querySelector(".message").before(notes);
}

// What a run replaces or was forked from (lineage.lineage_notes): a regenerate keeps the
// message of the run it replaces, an edit changed it.
function lineage(run, payload) {
  let text;
  let target;
  let step = "";
  if (run.replaces) {
    target = run.replaces;
    const old = views.get(target)?.section.dataset.payload;
    text = old === undefined ? "Replaces" : sameJson(JSON.parse(old), payload) ? "Regenerated from" : "Edited from";
  } else if (run.forked_from) {
    target = run.forked_from.run_id;
    text = "Forked from";
    step = run.forked_from.step < 0 ? " before its first step" : ` at step ${run.forked_from.step}`;
  } else {
    return null;
  }
  const note = el("p", "lineage muted", `${text} `);
  const link = el("a", "lineage-link", target);
  link.href = runLink(target);
  note.append(link, step);
  return note;
}

function settled(runId, section) {
  const state = client.state.run(runId);
  if (state?.status) return TERMINAL_STATUSES.has(state.status);
  return TERMINAL_STATUSES.has(section.querySelector(".run-status").textContent.trim());
}

// Edit and Regenerate start a run of the thread: not while one is active (the server would refuse
// that run's own with run_active; the others would race it).
function enableActions() {
  const busy = [...views].some(([runId, {section}]) => !settled(runId, section));
  for (const button of container.querySelectorAll("button[data-action=edit], button[data-action=regenerate]")) {
    button.disabled = busy || button.closest(".thread-run").classList.contains("sending");
  }
}

function refusal(error) {
  return `${error.code}: ${error.message}`;
}

function regenerate(section) {
  const error = section.querySelector(".branch-error");
  if (error) error.textContent = "";
  section.classList.add("sending");
  enableActions();
  client.regenerate({runId: section.dataset.runId})
    .catch((refused) => { if (error) error.textContent = refusal(refused); })
    .finally(() => {
      section.classList.remove("sending");
      enableActions();
    });
}

function edit(section) {
  const holder = section.querySelector(".message");
  if (holder.querySelector(".edit-form") || section.dataset.payload === undefined) return;
  const message = editableMessage(JSON.parse(section.dataset.payload));
  const form = editForm(message);
  const shown = [holder.querySelector(".trigger-message"), holder.querySelector(".message-actions")];
  const close = () => {
    form.remove();
    for (const node of shown) if (node) node.hidden = false;
  };
  for (const node of shown) if (node) node.hidden = true;
  holder.append(form);
  const text = form.querySelector("textarea");
  text.focus();
  form.querySelector(".edit-cancel").addEventListener("click", close);
  form.addEventListener("submit", (submit) => {
    submit.preventDefault();
    const error = form.querySelector(".edit-error");
    let payload;
    try {
      payload = message.payload(text.value);
    } catch (refused) {
      error.textContent = refused.message;
      return;
    }
    error.textContent = "";
    const send = form.querySelector("button[type=submit]");
    send.disabled = true;
    client.resend({runId: section.dataset.runId, payload}).then(close, (refused) => {
      error.textContent = refusal(refused);
      send.disabled = false;
    });
  });
}

container.addEventListener("click", (click) => {
  const button = click.target.closest("button[data-action=edit], button[data-action=regenerate]");
  const section = button?.closest(".thread-run");
  if (!section || button.disabled) return;
  if (button.dataset.action === "edit") edit(section);
  else regenerate(section);
});

showBranch();
