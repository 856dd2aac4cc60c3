// A chat page on chamvi_runs' client: each message starts a run of the agent in one thread (the
// conversation), or steers the run that is still answering. Everything is shown as text.
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
let latest = null;  // the state of the newest run
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
  if (asks.has(run.run_id)) lines.push(line("bubble input", asks.get(run.run_id)));
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
    if (item.kind === "decision") lines.push(line("muted", `${item.decision} by ${item.decided_by ?? "nobody"}`));
  }
  if (run.end?.error) lines.push(line("tool-result error", `${run.end.error.code}: ${run.end.error.message}`));
  section.replaceChildren(...lines);
  section.className = `run ${run.status}`;
}

function showApproval() {
  const waiting = latest?.waiting;
  $("approval").hidden = !waiting;
  if (waiting && $("approval").dataset.id !== waiting.approval_id) {
    $("approval").dataset.id = waiting.approval_id;
    $("approval-tool").textContent = waiting.tool_name;
    $("approval-input").textContent = JSON.stringify(waiting.input, null, 2);
    $("approval-reason").value = "";
  }
  $("stop").hidden = !latest || latest.ended;
}

client.on("run", (run) => {
  latest = run;
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
client.on("change", (run) => { show(run); showApproval(); });
client.on("connection", ({status, delay}) => {
  $("connection").textContent = status === "reconnecting" ? `reconnecting in ${delay} ms…` : status;
});

$("composer").addEventListener("submit", (submit) => {
  submit.preventDefault();
  const text = $("message").value;
  $("message").value = "";
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
    client[decision]($("approval").dataset.id, {reason}).then(() => { $("approval").hidden = true; }).catch(report);
  });
}
$("stop").addEventListener("click", () => client.cancel(latest.run_id).catch(report));
