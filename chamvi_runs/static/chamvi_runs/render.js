/* Draws a run's state (client.js) into the bundled pages. Text and JSON from the model, the tools
   and the users go in as text only (textContent), never as HTML. */

// The pages' one readable rendering of payloads, arguments and outputs (the server's pretty_json).
export const pretty = (value) => (value === undefined ? "" : JSON.stringify(value, null, 2));
export const asText = (value) => (typeof value === "string" ? value : pretty(value));

export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function setText(node, text) {
  // Rewriting an unchanged text would reset a reader's selection in it.
  if (node.textContent !== text) node.textContent = text;
}

function note(className, title, body) {
  const box = el("div", `bubble ${className}`);
  box.append(el("strong", "", title), el("pre", "", body));
  return box;
}

// The mark after a model's answer that ended before its end: by its step's finish reason (the
// server's thread summaries use the same words, views_pages.STOPPED), or, for a step that never
// finished, by how the run ended while it streamed.
const STOPPED = {
  length: "— cut off: the answer reached the model's length limit",
  content_filter: "— cut off by the provider's content filter",
  error: "— stopped: the model call failed",
  cancelled: "— stopped: the run was cancelled",
};
const INCOMPLETE = "— cut off: the model's answer stopped before its end";
const ENDED_MID_STEP = {cancelled: "— stopped: the run was cancelled", failed: "— stopped: the run failed"};

export function stopMark(item, state) {
  if (item.finish_reason) return STOPPED[item.finish_reason] || "";
  if (!state.end) return "";
  if (state.end.error?.code === "incomplete_response") return INCOMPLETE;
  return ENDED_MID_STEP[state.end.status] || "";
}

export function decisionItem(d) {
  const li = el("li", "decision");
  li.dataset.approvalId = d.approval_id;
  li.append(el("strong", "", d.decision), ` ${d.tool_name} by ${d.decided_by || "nobody"} at `);
  const time = el("time", "", d.decided_at ? new Date(d.decided_at).toLocaleString() : "?");
  if (d.decided_at) time.dateTime = d.decided_at;
  li.append(time);
  if (d.reason) li.append(`: ${d.reason}`);
  return li;
}

/* The conversation of one run in `log`: one or more elements per item of the state, kept in the
   state's order, updated in place while a step streams, dropped when a retry replaces them. */
export class Conversation {
  constructor(log) {
    this.log = log;
    this.nodes = new Map();  // state item -> its elements
  }

  elements(item, state) {
    let nodes = this.nodes.get(item);
    if (item.kind === "message") {
      if (!nodes) {
        const box = el("div", "bubble step");
        box.append(el("div", "reasoning"), el("div", "text"));
        nodes = [box];
      }
      const [box] = nodes;
      box.dataset.step = item.step;
      box.dataset.attempt = item.attempt;
      setText(box.querySelector(".reasoning"), item.reasoning);
      setText(box.querySelector(".text"), item.text);
      const mark = stopMark(item, state);
      const shown = box.querySelector(".cut");
      if (mark && !shown) box.append(el("div", "cut", mark));
      else if (mark) setText(shown, mark);
      else shown?.remove();
    } else if (item.kind === "input") {
      if (!nodes) {
        const box = el("div", "bubble input", asText(item.payload));
        box.dataset.inputId = item.input_id;
        nodes = [box];
      }
    } else if (item.kind === "tool") {
      if (!nodes) nodes = [note("tool-call", `→ ${item.name}`, pretty(item.input))];
      if (item.done && nodes.length === 1) {
        nodes.push(item.error
          ? note("tool-result error", `← ${item.name} failed`, item.error)
          : note("tool-result", `← ${item.name}`, pretty(item.output)));
      }
    } else {
      return [];  // decisions have their own list
    }
    this.nodes.set(item, nodes);
    return nodes;
  }

  render(state) {
    const kept = new Set();
    let previous = null;
    for (const item of state.items) {
      for (const node of this.elements(item, state)) {
        const expected = previous ? previous.nextSibling : this.log.firstChild;
        if (node !== expected) this.log.insertBefore(node, expected);
        previous = node;
      }
      kept.add(item);
    }
    for (const [item, nodes] of this.nodes) {
      if (kept.has(item)) continue;
      for (const node of nodes) node.remove();
      this.nodes.delete(item);
    }
    // What the server drew before the stream (a thread's summaries) goes once the stream has it.
    while (previous && previous.nextSibling) previous.nextSibling.remove();
    if (!previous) this.log.replaceChildren();
  }
}
