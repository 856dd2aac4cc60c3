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

// A JSON value on one line (wait_display.compact).
export const compact = (value) => (value === undefined ? "" : JSON.stringify(value));
// A question's answer on one line: a string as it is (wait_display.answer_text).
export const answerText = (value) => (typeof value === "string" ? value : compact(value));

function canonical(value) {
  if (Array.isArray(value)) return value.map(canonical);
  if (value && typeof value === "object") {
    return Object.fromEntries(Object.keys(value).sort().map((key) => [key, canonical(value[key])]));
  }
  return value;
}

/** Whether two JSON values are the same, whatever the order of their keys. */
export const sameJson = (a, b) => JSON.stringify(canonical(a)) === JSON.stringify(canonical(b));

/** What an approver changed in the arguments (wait_display.argument_changes): per key of an object,
    else the whole value (key ""), each side as compact JSON; none when nothing was edited. */
export function argumentChanges(proposed, approved) {
  if (approved === null || approved === undefined) return [];
  const object = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
  if (!object(proposed) || !object(approved)) {
    return sameJson(proposed, approved) ? [] : [{key: "", before: compact(proposed), after: compact(approved)}];
  }
  const keys = [...Object.keys(proposed), ...Object.keys(approved).filter((key) => !(key in proposed))];
  return keys
    .filter((key) => !(key in proposed) || !(key in approved) || !sameJson(proposed[key], approved[key]))
    .map((key) => ({
      key,
      before: key in proposed ? compact(proposed[key]) : "(none)",
      after: key in approved ? compact(approved[key]) : "(none)",
    }));
}

export function changesList(changes) {
  const box = el("div", "changes");
  const list = el("ul");
  for (const {key, before, after} of changes) {
    const li = el("li", "change");
    if (key) li.append(el("code", "", key), " ");
    li.append(el("span", "before", before), " → ", el("span", "after", after));
    list.append(li);
  }
  box.append(el("span", "muted", "changed before approving:"), list);
  return box;
}

/** A decided wait point in a run's list of decisions (templates/chamvi_runs/decision.html). */
export function decisionItem(d) {
  const li = el("li", "decision");
  li.dataset.approvalId = d.approval_id;
  if (d.decision === "answered") {
    li.append(el("strong", "", "answered"), ": ", el("span", "answer", answerText(d.answer)), ` (${d.tool_name})`);
  } else {
    li.append(el("strong", "", d.decision), ` ${d.tool_name}`);
  }
  li.append(` by ${d.decided_by || "nobody"} at `);
  const time = el("time", "", d.decided_at ? new Date(d.decided_at).toLocaleString() : "?");
  if (d.decided_at) time.dateTime = d.decided_at;
  li.append(time);
  if (d.reason) li.append(`: ${d.reason}`);
  const changes = argumentChanges(d.input, d.approved_input);
  if (changes.length) li.append(changesList(changes));
  return li;
}

/** How a page asks for an answer of the JSON Schema `schema` (wait_display.answer_form): "boolean"
    (Yes/No), "choice" (one of `choices`, each `value` the choice as JSON), "text" (a line) or
    "json" (any other value, typed as JSON). */
export function answerForm(schema) {
  if (schema && typeof schema === "object") {
    if (Array.isArray(schema.enum) && schema.enum.length) {
      return {kind: "choice", choices: schema.enum.map((c) => ({value: compact(c), label: answerText(c)}))};
    }
    if (schema.type === "boolean") return {kind: "boolean"};
    if (schema.type === "string") return {kind: "text"};
  }
  return {kind: "json"};
}

function button(label, attributes = {}) {
  const b = el("button", "", label);
  b.type = "submit";
  for (const [name, value] of Object.entries(attributes)) b.setAttribute(name, value);
  return b;
}

/** An open question of a run (templates/chamvi_runs/question.html): its text and, if the viewer
    may answer it, the form of its answer, which `onAnswers` sends. */
export function questionBox(waiting, {canAnswer}) {
  const box = el("div", "bubble question wait");
  box.dataset.approvalId = waiting.approval_id;
  box.dataset.kind = "input";
  box.append(el("strong", "", "Question"), " ", el("span", "muted tool-name", waiting.tool_name));
  box.append(typeof waiting.question === "string"
    ? el("p", "question-text", waiting.question)
    : el("pre", "", pretty(waiting.input)));
  if (waiting.client) {
    box.append(el("p", "muted", "The page's code answers it."));
    return box;
  }
  if (!canAnswer) {
    box.append(el("p", "muted", "The run's user must answer it."));
    return box;
  }
  const shape = answerForm(waiting.answer_schema);
  const form = el("form", "answer-form");
  form.dataset.form = shape.kind;
  if (shape.kind === "boolean") {
    form.append(button("Yes", {name: "answer", value: "true"}), " ", button("No", {name: "answer", value: "false"}));
  } else if (shape.kind === "choice") {
    const select = el("select");
    select.name = "answer";
    for (const {value, label} of shape.choices) {
      const option = el("option", "", label);
      option.value = value;
      select.append(option);
    }
    form.append(select, " ", button("Answer"));
  } else if (shape.kind === "text") {
    const input = el("input");
    Object.assign(input, {type: "text", name: "answer", size: 50, required: true, placeholder: "Your answer"});
    form.append(input, " ", button("Answer"));
  } else {
    const text = el("textarea");
    Object.assign(text, {name: "answer", rows: 4, cols: 50, required: true, placeholder: "Your answer, as JSON"});
    form.append(text, el("br"), button("Answer"));
  }
  form.append(" ", el("span", "answer-error"));
  form.querySelector(".answer-error").setAttribute("role", "alert");
  box.append(form);
  return box;
}

/** The answer an answer form holds (its `submitter`: the Yes or No button); throws an Error that
    says why when typed JSON is not JSON. */
export function readAnswer(form, submitter) {
  const field = form.querySelector("[name=answer]");
  switch (form.dataset.form) {
    case "boolean":
      return submitter?.value === "true";
    case "choice":
      return JSON.parse(field.value);
    case "text":
      return field.value;
    default:
      try {
        return JSON.parse(field.value);
      } catch (error) {
        throw new Error(`not JSON: ${error.message}`);
      }
  }
}

/** Answers the questions drawn in `container` with `send(approvalId, answer)` (a promise): a
    refusal is said beside its form, which stays as it was; an answer taken replaces the form with
    it, until the run's events say it is decided. */
export function onAnswers(container, send) {
  container.addEventListener("submit", (submit) => {
    const form = submit.target.closest?.("form.answer-form");
    if (!form) return;
    submit.preventDefault();
    const box = form.closest(".question");
    const error = form.querySelector(".answer-error");
    let answer;
    try {
      answer = readAnswer(form, submit.submitter);
    } catch (refusal) {
      error.textContent = refusal.message;
      return;
    }
    error.textContent = "";
    const buttons = [...form.querySelectorAll("button")];
    for (const b of buttons) b.disabled = true;
    send(box.dataset.approvalId, answer).then(
      () => form.replaceWith(el("p", "answered", `Your answer: ${answerText(answer)}`)),
      (refused) => {
        error.textContent = `${refused.code}: ${refused.message}`;
        for (const b of buttons) b.disabled = false;
      },
    );
  });
}

/** The arguments an approval box's editor (textarea.arguments) holds, when they differ from the
    proposal (the editor's first content): `{arguments}`, or `{}` when unchanged or without an
    editor. Throws an Error that says why when they are not JSON. */
export function editedArguments(box) {
  const editor = box.querySelector("textarea.arguments");
  if (!editor) return {};
  let edited;
  try {
    edited = JSON.parse(editor.value);
  } catch (error) {
    throw new Error(`The arguments are not JSON: ${error.message}`);
  }
  return sameJson(edited, JSON.parse(editor.defaultValue)) ? {} : {arguments: edited};
}

/** The "Edit arguments" control of an editable approval (templates: details.edit-arguments). */
export function argumentsEditor(input) {
  const details = el("details", "edit-arguments");
  const text = el("textarea", "arguments");
  Object.assign(text, {rows: 6, cols: 50, spellcheck: false});
  text.setAttribute("aria-label", "arguments as JSON");
  // Its first content is its defaultValue: the proposal editedArguments compares with.
  text.textContent = pretty(input);
  details.append(el("summary", "", "Edit arguments"), text);
  return details;
}

// Approve buttons say when they approve changed arguments.
export function markEdits(container, approveButton) {
  container.addEventListener("input", (typing) => {
    const editor = typing.target;
    if (!editor.matches?.("textarea.arguments")) return;
    const scope = editor.closest(".wait, form, tr");
    const target = approveButton(scope);
    if (!target) return;
    let changed = true;
    try {
      changed = !sameJson(JSON.parse(editor.value), JSON.parse(editor.defaultValue));
    } catch {
      // Not JSON yet: still an edit.
    }
    target.textContent = changed ? "Approve edited" : "Approve";
  });
}

/* The conversation of one run in `log`: one or more elements per item of the state, kept in the
   state's order, updated in place while a step streams, dropped when a retry replaces them. */
export class Conversation {
  constructor(log) {
    this.log = log;
    this.nodes = new Map();  // state item -> its elements
    this.children = new Map();  // child run id -> {node, head, conversation}
  }

  /** A child run (delegation) as a block under the model call that started it: its status, then
      its own conversation, nested. */
  childNode(child) {
    let entry = this.children.get(child.run_id);
    if (!entry) {
      const node = el("div", "child-run");
      node.dataset.runId = child.run_id;
      const head = el("div", "child-head muted");
      const log = el("div", "child-log");
      node.append(head, log);
      entry = {node, head, conversation: new Conversation(log)};
      this.children.set(child.run_id, entry);
    }
    entry.node.dataset.status = child.status ?? "queued";
    setText(entry.head, `↳ delegated to run ${child.run_id}: ${child.status ?? "queued"}`);
    entry.conversation.render(child);
    return entry.node;
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
    const keptChildren = new Set();
    let previous = null;
    const place = (node) => {
      const expected = previous ? previous.nextSibling : this.log.firstChild;
      if (node !== expected) this.log.insertBefore(node, expected);
      previous = node;
    };
    for (const item of state.items) {
      for (const node of this.elements(item, state)) place(node);
      kept.add(item);
      // The child runs a model call started come right after it.
      if (item.kind !== "message" || !state.childrenOf) continue;
      for (const child of state.childrenOf(item.step)) {
        place(this.childNode(child));
        keptChildren.add(child.run_id);
      }
    }
    for (const [item, nodes] of this.nodes) {
      if (kept.has(item)) continue;
      for (const node of nodes) node.remove();
      this.nodes.delete(item);
    }
    for (const [runId, entry] of this.children) {
      if (keptChildren.has(runId)) continue;
      entry.node.remove();
      this.children.delete(runId);
    }
    // What the server drew before the stream (a thread's summaries) goes once the stream has it.
    while (previous && previous.nextSibling) previous.nextSibling.remove();
    if (!previous) this.log.replaceChildren();
  }
}

/** How a run's trigger payload is edited as text (the pages' Edit, then resend): a string as it is;
    an object with a string `message` (what the example chat page sends) by its message, its other
    fields kept; anything else as JSON typed out. `text` is what the editor starts with,
    `payload(text)` the payload to resend (it throws an Error that says why when typed JSON is not
    JSON). */
export function editableMessage(payload) {
  if (typeof payload === "string") return {text: payload, json: false, payload: (text) => text};
  const object = payload !== null && typeof payload === "object" && !Array.isArray(payload);
  if (object && typeof payload.message === "string") {
    return {text: payload.message, json: false, payload: (text) => ({...payload, message: text})};
  }
  return {
    text: pretty(payload),
    json: true,
    payload(text) {
      try {
        return JSON.parse(text);
      } catch (error) {
        throw new Error(`not JSON: ${error.message}`);
      }
    },
  };
}

/** The form that edits a message (`editableMessage`): its text, Send and Cancel, and the line where
    a refusal is said. */
export function editForm(message) {
  const form = el("form", "edit-form");
  const text = el("textarea", "edit-text");
  Object.assign(text, {rows: message.json ? 6 : 3, cols: 60, required: true});
  text.setAttribute("aria-label", "your message, edited");
  text.value = message.text;
  const send = el("button", "", "Send");
  send.type = "submit";
  const cancel = el("button", "edit-cancel", "Cancel");
  cancel.type = "button";
  const error = el("span", "edit-error");
  error.setAttribute("role", "alert");
  form.append(text, el("br"), send, " ", cancel, " ", error);
  return form;
}
