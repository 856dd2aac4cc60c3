/* The thread page (templates/chamvi_runs/thread.html): every run of the thread, live, also the
   runs started while the page is open. Decisions are taken on each run's own page. */
import {connectThread} from "./client.js";
import {Conversation, el} from "./render.js";

const page = JSON.parse(document.getElementById("chamvi-page").textContent);
const container = document.getElementById("thread-runs");
const runUrl = document.getElementById("run-url").getAttribute("href");
const views = new Map();  // run id -> {section, conversation}

function viewOf(section) {
  return {section, conversation: new Conversation(section.querySelector(".log"))};
}

for (const section of container.querySelectorAll(".thread-run")) views.set(section.dataset.runId, viewOf(section));

function newRun(runId) {
  const section = el("section", "thread-run");
  section.dataset.runId = runId;
  const status = el("p", "muted", "Status: ");
  const link = el("a", "run-link", runId);
  link.href = runUrl.replace("RUN_ID", encodeURIComponent(runId));
  status.append(el("span", "status run-status", "queued"), " ", el("span", "run-error"), " · ", link);
  section.append(el("div", "log"), el("div", "run-waiting"), status);
  container.append(section);
  document.getElementById("no-runs")?.remove();
  return viewOf(section);
}

const client = connectThread(page.thread, {base: page.base, scope: page.scope});
client.on("change", (state) => {
  let view = views.get(state.run_id);
  if (!view) views.set(state.run_id, (view = newRun(state.run_id)));
  const {section, conversation} = view;
  conversation.render(state);
  if (state.status) section.querySelector(".run-status").textContent = state.status;
  const error = state.end?.error;
  section.querySelector(".run-error").textContent = error ? `${error.code}: ${error.message}` : "";
  const waiting = section.querySelector(".run-waiting");
  if (state.waiting) {
    const box = el("div", "bubble approval", "Waiting for approval of ");
    box.append(el("strong", "", state.waiting.tool_name), ": decide on the run page.");
    waiting.replaceChildren(box);
  } else if (state.ended || state.decisions.length) {
    waiting.replaceChildren();
  }
});
