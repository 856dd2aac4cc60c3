/* The run page (templates/chamvi_runs/run.html): the run's conversation as it streams, its open
   approval and questions, its decisions, and the controls to steer, cancel, decide (an approver may
   edit the arguments first) and answer. */
import {connectRun} from "./client.js";
import {
  Conversation, argumentsEditor, decisionItem, editedArguments, el, markEdits, onAnswers, pretty, questionBox,
} from "./render.js";

const page = JSON.parse(document.getElementById("chamvi-page").textContent);
const $ = (id) => document.getElementById(id);
// A notice about the run's state lasts while that is true: `holds(state)` says whether it still is,
// asked on every change of the run; `next(state)` is what replaces it then ("" clears it).
let shown = null;
function notice(text, holds = null, next = () => "") {
  $("notice").textContent = text;
  shown = holds ? {holds, next} : null;
  recheck(client.state);
}
function recheck(state) {
  if (shown && !shown.holds(state)) notice(shown.next(state));
}
// The template's {% csrf_token %}: the cookie may be out of a script's reach (CSRF_COOKIE_HTTPONLY,
// CSRF_USE_SESSIONS), and commands go over HTTP once the client falls back to Server-Sent Events.
const csrfToken = document.querySelector("input[name=csrfmiddlewaretoken]")?.value;
const client = connectRun(page.run_id, {base: page.base, csrfToken});
const conversation = new Conversation($("log"));
const decided = new Set([...$("decisions").querySelectorAll("li.decision")].map((li) => li.dataset.approvalId));

// Wait points the stream showed open: a box of one of them goes once it is no longer open (answered,
// decided, the run resumed). A box the server drew stays through a replay until the replay has it.
const seenOpen = new Set();

function boxes() {
  return [...$("waiting").querySelectorAll(".wait")];
}

function boxOf(approvalId) {
  return boxes().find((box) => box.dataset.approvalId === approvalId) || null;
}

function approvalBox(waiting) {
  const box = el("div", "bubble approval wait");
  box.dataset.approvalId = waiting.approval_id;
  box.dataset.kind = "approval";
  box.append(el("strong", "", "Approval needed:"), " ", el("span", "tool-name", waiting.tool_name), el("pre", "", pretty(waiting.input)));
  // A child run's approval, decided from its parent's page.
  const holder = client.stateOf(waiting.approval_id);
  if (holder && holder.run_id !== page.run_id) {
    box.dataset.runId = holder.run_id;
    box.append(el("p", "muted child-of", `Asked by the child run ${holder.run_id}.`));
  }
  if (page.can_decide) {
    if (waiting.editable) box.append(argumentsEditor(waiting.input));
    const reason = el("textarea", "reason");
    Object.assign(reason, {rows: 2, cols: 50, placeholder: "reason (optional)"});
    // The page's first approval box keeps the id pages and tests know it by.
    if (!document.getElementById("reason")) reason.id = "reason";
    box.append(reason, el("br"));
    for (const [action, label] of [["approve", "Approve"], ["deny", "Deny"]]) {
      const button = el("button", "", label);
      button.type = "button";
      button.dataset.action = action;
      box.append(button, " ");
    }
    box.append(el("span", "decide-error"));
  } else {
    box.append(el("p", "muted", "Someone with the permission to decide approvals must approve or deny it."));
  }
  return box;
}

function drawWaits(state) {
  // The run's open wait points, and those of the child runs it started.
  const waits = state.allWaits ? state.allWaits() : state.waits || (state.waiting ? [state.waiting] : []);
  const open = new Set(waits.map((w) => w.approval_id));
  for (const id of open) seenOpen.add(id);
  for (const box of boxes()) {
    const id = box.dataset.approvalId;
    if (decided.has(id) || state.ended || (seenOpen.has(id) && !open.has(id))) box.remove();
  }
  for (const waiting of waits) {
    if (decided.has(waiting.approval_id) || boxOf(waiting.approval_id)) continue;
    $("waiting").append(waiting.kind === "input"
      ? questionBox(waiting, {canAnswer: page.can_answer})
      : approvalBox(waiting));
  }
}

function render(state) {
  conversation.render(state);
  $("status").textContent = state.status || page.status;
  for (const decision of state.decisions) {
    if (decided.has(decision.approval_id)) continue;
    decided.add(decision.approval_id);
    for (const placeholder of $("decisions").querySelectorAll(".no-decisions")) placeholder.remove();
    $("decisions").append(decisionItem(decision));
  }
  drawWaits(state);
  recheck(state);
  if (state.end) {
    const error = state.end.error;
    $("error").textContent = error ? `${error.code}: ${error.message}` : "";
    $("controls")?.remove();
  }
}

client.on("change", render);

function refused(error) {
  notice(`Not done (${error.code}): ${error.message}`);
}

$("waiting").addEventListener("click", (click) => {
  const button = click.target.closest("button[data-action]");
  const box = button?.closest(".wait");
  if (!button || !box) return;
  const approvalId = box.dataset.approvalId;
  const action = button.dataset.action;
  const error = box.querySelector(".decide-error");
  let edit = {};
  try {
    if (action === "approve") edit = editedArguments(box);
  } catch (refusal) {
    if (error) error.textContent = refusal.message;
    return;
  }
  if (error) error.textContent = "";
  const reason = box.querySelector(".reason");
  for (const b of box.querySelectorAll("button")) b.disabled = true;
  client[action]({approvalId, reason: reason ? reason.value : "", ...edit}).then(
    () => {
      box.remove();
      const verb = action === "deny" ? "Denied" : edit.arguments === undefined ? "Approved" : "Approved with your changes";
      // Until the run ends, or waits on another approval.
      notice(`${verb}: the run goes on.`,
        (s) => !s.ended && (!s.waiting || s.waiting.approval_id === approvalId));
    },
    (failure) => {
      // Arguments that do not fit the tool are said beside them: the approver fixes them there.
      if (error && ["invalid_arguments", "not_editable"].includes(failure.code)) {
        error.textContent = `${failure.code}: ${failure.message}`;
      } else {
        refused(failure);
      }
      if (["already_decided", "expired", "not_found"].includes(failure.code)) box.remove();
      else for (const b of box.querySelectorAll("button")) b.disabled = false;
    },
  );
});
markEdits($("waiting"), (box) => box?.querySelector("button[data-action=approve]"));

onAnswers($("waiting"), (approvalId, answer) => client.answer({approvalId, answer}).then(() => {
  const open = client.state.waits || [];
  const others = open.filter((w) => w.kind === "input" && !w.client).length;
  const known = new Set(open.map((w) => w.approval_id));
  // Until the run ends or opens another wait point.
  notice(others ? "Answered: the run goes on once the other questions are answered." : "Answered: the run goes on.",
    (s) => !s.ended && (s.waits || []).every((w) => known.has(w.approval_id)));
}));

$("input-form")?.addEventListener("submit", (submit) => {
  submit.preventDefault();
  const text = $("input-text");
  if (!text.value) return;
  const taken = (s, inputId) => s.items.some((item) => item.kind === "input" && item.input_id === inputId);
  client.input(text.value).then(
    // Until the conversation shows it, or the run ends without having taken it.
    ({input_id: inputId}) => notice("Sent: the run takes it before its next model call.",
      (s) => !s.ended && !taken(s, inputId),
      (s) => (taken(s, inputId) ? "" : "The run ended before it took your message.")),
    refused,
  );
  text.value = "";
});

$("cancel")?.addEventListener("click", () => {
  client.cancel().then(
    // A requested cancel is news until the run ends: its status says the rest.
    (ack) => (ack.status === "cancelled"
      ? notice("Cancelled.")
      : notice(`Cancel requested (the run is ${ack.status}).`, (s) => !s.ended)),
    refused,
  );
});

client.on("connection", ({status, error}) => {
  if (error) notice(`Not following the run (${error.code}): ${error.message}`);
  else if (status === "reconnecting") notice("Connection lost: reconnecting…");
  else if (status === "open" && $("notice").textContent.startsWith("Connection lost")) notice("");
});
