// A chat page on chamvi_runs' client: each message starts a run of the agent in one thread (the
// conversation), or steers the run that is still answering; the user answers the questions runs ask
// and approves (or edits, then approves) their tool calls, and may edit an earlier message or have
// an answer regenerated: the conversation then goes on from the new run (the thread's current
// branch; the runs left behind are no longer shown). Everything is shown as text.
import {ChamviError, connectThread} from "../chamvi_runs/client.js";

const $ = (id) => document.getElementById(id);
const {agent, api} = $("chat").dataset;
const base = api.replace(/api\/runs\/$/, "");  // where the site included chamvi_runs.urls
const csrf = () => $("composer").elements.csrfmiddlewaretoken.value;

// The thread is the conversation: kept in the address, so a reload goes on with it.
const params = new URLSearchParams(location.search);
if (!params.has("thread")) {
  const random = [...crypto.getRandomValues(new Uint8Array(12))].map((b) => b.toString(16).padStart(2, "0"));
  params.set("thread", `chat-${random.join("")}`);
  history.replaceState(null, "", `?${params}`);
}
const thread = params.get("thread");
const client = connectThread(thread, {base});
const sections = new Map();  // run id -> its <section>
const asks = new Map();  // run id -> the message that started it
let editing = null;  // {runId, form}: the message being edited
const newest = () => client.runs().at(-1) ?? null;  // the newest run of the current branch
const busy = () => client.runs().some((run) => !run.ended);
const report = ({code = "error", message}) => { $("notice").textContent = `${code}: ${message}`; };

// The API's JSON, or a ChamviError: the API's, or the HTTP status of an answer that is not the API's
// JSON (Django's CSRF failure is an HTML page).
async function call(url, init) {
  const response = await fetch(url, init).catch((error) => {
    throw new ChamviError("connection_lost", error.message);
  });
  const body = await response.json().catch(() => null);
  if (response.ok && body) return body;
  const {code = `http_${response.status}`, message = response.statusText} = body?.error ?? {};
  throw new ChamviError(code, message, {status: response.status});
}

function line(className, text) {
  const p = document.createElement("p");
  p.className = className;
  p.textContent = text;
  return p;
}

function show(run) {
  let section = sections.get(run.run_id);
  if (!section) {
    section = document.createElement("section");
    sections.set(run.run_id, section);
    $("conversation").append(section);
  }
  const lines = [];
  if (editing?.runId === run.run_id) {
    lines.push(editing.form);
  } else if (asks.has(run.run_id)) {
    const message = line("bubble input", asks.get(run.run_id));
    if (run.ended) message.append(" ", action("Edit", "edit", run.run_id));
    lines.push(message);
  }
  for (const item of run.items) {
    if (item.kind === "input") lines.push(line("bubble input", String(item.payload)));
    if (item.kind === "message" && (item.text || item.reasoning)) {
      const bubble = line("bubble step", "");
      bubble.dataset.step = item.step;
      bubble.dataset.attempt = item.attempt;
      if (item.reasoning) bubble.append(line("reasoning", item.reasoning));
      bubble.append(line("text", item.text));
      lines.push(bubble);
    }
    if (item.kind === "tool") {
      const result = item.done ? ` → ${item.error ?? JSON.stringify(item.output)}` : " …";
      lines.push(line("bubble tool-call", `${item.name}(${JSON.stringify(item.input)})${result}`));
    }
    if (item.kind === "decision") lines.push(line("muted", decided(item)));
  }
  if (run.end?.error) lines.push(line("tool-result error", `${run.end.error.code}: ${run.end.error.message}`));
  if (run.ended) lines.push(action("Regenerate", "regenerate", run.run_id));
  section.replaceChildren(...lines);
  section.className = `run ${run.status}`;
}

// Edit and Regenerate of a settled run: they wait while a run of the conversation is active.
function action(text, name, runId) {
  const button = Object.assign(document.createElement("button"), {type: "button", textContent: text});
  Object.assign(button.dataset, {action: name, run: runId});
  button.disabled = busy();
  return button;
}

function enableActions() {
  for (const button of $("conversation").querySelectorAll("button[data-action]")) button.disabled = busy();
}

// The message of run `runId` in a form: sent again, it starts a new run from the history `runId`
// started from, with the same shape of payload as a new message.
function edit(runId) {
  const form = document.createElement("form");
  form.className = "bubble input edit-form";
  const text = Object.assign(document.createElement("input"), {type: "text", size: 50, required: true, value: asks.get(runId)});
  const cancel = Object.assign(document.createElement("button"), {type: "button", textContent: "Cancel"});
  form.append(text, " ", Object.assign(document.createElement("button"), {textContent: "Send"}), " ", cancel);
  const close = () => {
    editing = null;
    // Once the new run is in, the edited one is off the branch: no longer shown.
    if (sections.has(runId)) show(client.state.run(runId));
  };
  cancel.addEventListener("click", close);
  form.addEventListener("submit", (submit) => {
    submit.preventDefault();
    client.resend({runId, payload: {message: text.value}})
      .then(({run_id: newRun}) => {
        asks.set(newRun, text.value);
        close();
      })
      .catch(report);
  });
  editing = {runId, form};
  show(client.state.run(runId));
  text.focus();
}

$("conversation").addEventListener("click", ({target}) => {
  const {action: name, run: runId} = target.dataset ?? {};
  if (name === "edit") edit(runId);
  if (name === "regenerate") {
    client.regenerate({runId}).then(({run_id: newRun}) => asks.set(newRun, asks.get(runId))).catch(report);
  }
});

// A decision as a line: an answer with what it said, an approval with what the approver changed.
function decided(item) {
  const by = `by ${item.decided_by ?? "nobody"}`;
  if (item.decision === "answered") {
    return `answered: ${typeof item.answer === "string" ? item.answer : JSON.stringify(item.answer)} ${by}`;
  }
  const {input, approved_input: approved} = item;
  if (approved == null) return `${item.decision} ${by}`;
  const keys = [...new Set([...Object.keys(input ?? {}), ...Object.keys(approved)])];
  const shown = (value) => (value === undefined ? "(none)" : JSON.stringify(value));
  const changes = keys.filter((key) => shown(input?.[key]) !== shown(approved[key]))
    .map((key) => `${key} ${shown(input?.[key])} → ${shown(approved[key])}`);
  return `${item.decision} ${by} (changed: ${changes.join(", ")})`;
}

// The first open approval of the newest run. Its arguments may be edited before approving them.
function showApproval() {
  const latest = newest();
  const waiting = latest?.waits.find((wait) => wait.kind === "approval");
  $("approval").hidden = !waiting;
  if (waiting && $("approval").dataset.id !== waiting.approval_id) {
    $("approval").dataset.id = waiting.approval_id;
    $("approval-tool").textContent = waiting.tool_name;
    $("approval-input").textContent = JSON.stringify(waiting.input, null, 2);
    $("approval-reason").value = "";
    const editor = $("approval-arguments");
    if (editor) {
      editor.value = JSON.stringify(waiting.input, null, 2);
      $("approval-edit").hidden = !waiting.editable;
      $("approval-edit").open = false;
    }
  }
  $("stop").hidden = !latest || latest.ended;
}

// The arguments to approve: `{arguments}` when the approver changed them, else `{}`.
function edited() {
  const editor = $("approval-arguments");
  const waiting = newest()?.waits.find((wait) => wait.approval_id === $("approval").dataset.id);
  if (!editor || !waiting?.editable) return {};
  const args = JSON.parse(editor.value);  // a SyntaxError is reported as it is
  return JSON.stringify(args) === JSON.stringify(waiting.input) ? {} : {arguments: args};
}

// The questions runs of the thread ask their user: one form each, its answer shaped by the
// question's answer_schema (Yes/No, one of its choices, a line of text, or JSON).
function questionForm(waiting) {
  const form = document.createElement("form");
  form.className = "bubble question";
  form.dataset.id = waiting.approval_id;
  form.append(line("question-text", waiting.question ?? JSON.stringify(waiting.input)));
  const schema = waiting.answer_schema ?? {};
  const field = (tag, attributes) => Object.assign(document.createElement(tag), {name: "answer", ...attributes});
  const submit = (text, value = "") => Object.assign(document.createElement("button"), {textContent: text, value});
  let read;
  if (Array.isArray(schema.enum)) {
    const select = field("select");
    for (const choice of schema.enum) {
      const label = typeof choice === "string" ? choice : JSON.stringify(choice);
      select.append(Object.assign(document.createElement("option"), {value: JSON.stringify(choice), textContent: label}));
    }
    form.append(select, submit("Answer"));
    read = () => JSON.parse(select.value);
  } else if (schema.type === "boolean") {
    form.append(submit("Yes", "true"), " ", submit("No", "false"));
    read = (button) => button?.value === "true";
  } else if (schema.type === "string") {
    const input = field("input", {type: "text", size: 50, required: true, placeholder: "Your answer"});
    form.append(input, submit("Answer"));
    read = () => input.value;
  } else {
    const text = field("textarea", {rows: 3, cols: 50, required: true, placeholder: "Your answer, as JSON"});
    form.append(text, submit("Answer"));
    read = () => JSON.parse(text.value);
  }
  const error = line("answer-error", "");
  form.append(error);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    try {
      const answer = read(event.submitter);
      client.answer({approvalId: waiting.approval_id, answer})
        .then(() => form.remove())
        .catch(({code, message}) => { error.textContent = `${code}: ${message}`; });
    } catch ({message}) {
      error.textContent = `not JSON: ${message}`;
    }
  });
  return form;
}

function showQuestions() {
  const box = $("questions");
  if (!box) return;
  const open = client.runs().flatMap((run) => run.waits)
    .filter((wait) => wait.kind === "input" && !wait.client);
  const ids = new Set(open.map((wait) => wait.approval_id));
  for (const form of [...box.children]) if (!ids.has(form.dataset.id)) form.remove();
  const shown = new Set([...box.children].map((form) => form.dataset.id));
  for (const wait of open) if (!shown.has(wait.approval_id)) box.append(questionForm(wait));
}

client.on("run", (run) => {
  // A run started before this page opened: its first message is in its trigger.
  if (!asks.has(run.run_id)) {
    call(`${api}${encodeURIComponent(run.run_id)}/`)
      .then(({trigger: {payload}}) => {
        asks.set(run.run_id, typeof payload.message === "string" ? payload.message : JSON.stringify(payload));
        show(run);
      })
      .catch(report);
  }
});
client.on("change", (run) => { show(run); showApproval(); showQuestions(); enableActions(); });
// A regenerate or an edit moved the conversation to another branch: only its runs are shown.
client.on("branch", (branch) => {
  for (const [runId, section] of sections) {
    if (!branch.includes(runId)) {
      section.remove();
      sections.delete(runId);
    }
  }
  for (const runId of branch) if (sections.has(runId)) $("conversation").append(sections.get(runId));
  showApproval();
  showQuestions();
  enableActions();
});
client.on("connection", ({status, delay}) => {
  $("connection").textContent = status === "reconnecting" ? `reconnecting in ${delay} ms…` : status;
});

$("composer").addEventListener("submit", (submit) => {
  submit.preventDefault();
  const text = $("message").value;
  $("message").value = "";
  const latest = newest();
  if (latest && latest.status === "running") {
    client.input(latest.run_id, text).catch(report);
    return;
  }
  const headers = {"Content-Type": "application/json", "X-CSRFToken": csrf()};
  call(api, {method: "POST", headers, body: JSON.stringify({agent, thread, payload: {message: text}})})
    .then((run) => asks.set(run.id, text))
    .catch(report);
});

for (const decision of ["approve", "deny"]) {
  $(decision).addEventListener("click", () => {
    const reason = $("approval-reason").value;
    let edit = {};
    try {
      if (decision === "approve") edit = edited();
    } catch ({message}) {
      report({code: "invalid_arguments", message: `the arguments are not JSON: ${message}`});
      return;
    }
    client[decision]($("approval").dataset.id, {reason, ...edit}).then(() => { $("approval").hidden = true; }).catch(report);
  });
}
$("stop").addEventListener("click", () => client.cancel(newest().run_id).catch(report));
