/* The run page (templates/chamvi_runs/run.html): the run's conversation as it streams, its open
   approval, its decisions, and the controls to steer, cancel and decide. */
import {connectRun} from "./client.js";
import {Conversation, decisionItem, el, pretty} from "./render.js";

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

function waitingBox() {
  return $("waiting").querySelector("[data-approval-id]");
}

function drawWaiting(waiting) {
  const box = el("div", "bubble approval");
  box.dataset.approvalId = waiting.approval_id;
  box.append(el("strong", "", "Approval needed:"), " ", el("span", "tool-name", waiting.tool_name), el("pre", "", pretty(waiting.input)));
  if (page.can_decide) {
    const reason = el("textarea");
    Object.assign(reason, {id: "reason", rows: 2, cols: 50, placeholder: "reason (optional)"});
    box.append(reason, el("br"));
    for (const [action, label] of [["approve", "Approve"], ["deny", "Deny"]]) {
      const button = el("button", "", label);
      button.type = "button";
      button.dataset.action = action;
      box.append(button, " ");
    }
  } else {
    box.append(el("p", "muted", "Someone with the permission to decide approvals must approve or deny it."));
  }
  $("waiting").replaceChildren(box);
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
  // The box the server drew (a reason may be typed in it) stays through a replay that comes to the
  // same approval; it goes once that approval is decided or the run has ended.
  const box = waitingBox();
  if (box && (decided.has(box.dataset.approvalId) || state.ended)) $("waiting").replaceChildren();
  if (state.waiting && !decided.has(state.waiting.approval_id) && waitingBox()?.dataset.approvalId !== state.waiting.approval_id) {
    drawWaiting(state.waiting);
  }
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
  const box = waitingBox();
  if (!button || !box) return;
  const reason = box.querySelector("#reason, textarea, input");
  for (const b of box.querySelectorAll("button")) b.disabled = true;
  const action = button.dataset.action;
  client[action]({approvalId: box.dataset.approvalId, reason: reason ? reason.value : ""}).then(
    () => {
      const approvalId = box.dataset.approvalId;
      $("waiting").replaceChildren();
      // Until the run ends, or waits on another approval.
      notice(`${action === "approve" ? "Approved" : "Denied"}: the run goes on.`,
        (s) => !s.ended && (!s.waiting || s.waiting.approval_id === approvalId));
    },
    (error) => {
      refused(error);
      if (["already_decided", "expired", "not_found"].includes(error.code)) $("waiting").replaceChildren();
      else for (const b of box.querySelectorAll("button")) b.disabled = false;
    },
  );
});

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
