/* Renders the events of runs (SPEC §8) into the chat pages: run.html and thread.html.
   Data only ever goes in as text (textContent, attributes), never as HTML. */
(() => {
  "use strict";

  // The pages' one readable rendering of payloads, arguments and outputs (the server's pretty_json).
  const pretty = (value) => (value === undefined ? "" : JSON.stringify(value, null, 2));
  const asText = (value) => (typeof value === "string" ? value : pretty(value));

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function open(path) {
    const proto = location.protocol === "https:" ? "wss" : "ws";
    return new WebSocket(`${proto}://${location.host}${path}`);
  }

  /* Delays between reconnects: 1 s, doubling to 30 s while connections keep failing (a server that
     is down, a site without a channel layer), back to 1 s once an event arrives. */
  class Backoff {
    constructor() { this.reset(); }
    reset() { this.delay = 1000; }
    next() { const delay = this.delay; this.delay = Math.min(this.delay * 2, 30000); return delay; }
  }

  function decisionItem(d) {
    const li = el("li", "decision");
    li.dataset.approvalId = d.approval_id;
    li.append(el("strong", "", d.decision), ` ${d.tool_name} by ${d.decided_by || "nobody"} at `);
    const time = el("time", "", d.decided_at ? new Date(d.decided_at).toLocaleString() : "?");
    if (d.decided_at) time.dateTime = d.decided_at;
    li.append(time);
    if (d.reason) li.append(`: ${d.reason}`);
    return li;
  }

  /* One run's conversation. Elements it may update (any may be null): log, status, error,
     waiting, decisions, controls, noticeEl. ``send(message)`` sends a command on the socket. */
  class RunView {
    constructor(options) {
      Object.assign(this, {canDecide: false, replaceLog: false, send: null}, options);
      this.lastSeq = 0;
      this.steps = {};  // step index -> {attempt, el, ended}
      this.settled = false;
      // Approvals decided already: a replay goes past their run.waiting, which must not ask again.
      this.decided = new Set();
      if (this.decisions) {
        for (const li of this.decisions.querySelectorAll("li.decision")) this.decided.add(li.dataset.approvalId);
      }
    }

    notice(text) { if (this.noticeEl) this.noticeEl.textContent = text; }

    handle(ev) {
      if (typeof ev.seq !== "number") { this.reply(ev); return; }
      if (ev.seq <= this.lastSeq) return;
      this.lastSeq = ev.seq;
      if (this.replaceLog) {
        // The server rendered a summary; the stream renders the whole run from its first event.
        this.replaceLog = false;
        this.log.textContent = "";
      }
      const handler = this.on[ev.type];
      if (handler) handler.call(this, ev);
    }

    reply(ev) {
      if (ev.type === "error") {
        this.notice(`Not done (${ev.code}): ${ev.message}`);
        if (["already_decided", "expired", "not_found"].includes(ev.code)) this.clearWaiting();
      } else if (ev.type === "ack") {
        if (ev.action === "approve" || ev.action === "deny") {
          this.clearWaiting();
          this.notice(`${ev.action === "approve" ? "Approved" : "Denied"}: the run goes on.`);
        } else if (ev.action === "input") {
          this.notice("Sent: the run takes it before its next model call.");
        } else if (ev.action === "cancel") {
          this.notice(ev.status === "cancelled" ? "Cancelled." : `Cancel requested (the run is ${ev.status}).`);
        }
      }
    }

    setStatus(status) { if (this.status && status) this.status.textContent = status; }

    stepBox(ev) {
      let s = this.steps[ev.step];
      const attempt = ev.attempt || 0;
      if (s && attempt < s.attempt) return null;  // an older attempt: ignore it
      if (!s || attempt > s.attempt) {
        const box = el("div", "bubble step");
        box.append(el("div", "reasoning"), el("div", "text"));
        if (s) s.el.remove();  // a retry after a crash: only the highest attempt is shown
        this.log.append(box);
        s = this.steps[ev.step] = {attempt, el: box, ended: false};
      }
      return s;
    }

    note(className, title, body) {
      const box = el("div", `bubble ${className}`);
      box.append(el("strong", "", title), el("pre", "", body));
      this.log.append(box);
      return box;
    }

    clearWaiting() { if (this.waiting) this.waiting.textContent = ""; }

    showWaiting(ev) {
      if (!this.waiting || this.settled || this.decided.has(ev.approval_id)) return;
      this.setStatus("waiting");
      // Already shown (drawn by the server, or by an earlier replay): keep it and what was typed in it.
      if (this.waiting.querySelector(`[data-approval-id="${CSS.escape(ev.approval_id)}"]`)) return;
      const box = el("div", "bubble approval");
      box.dataset.approvalId = ev.approval_id;
      box.append(el("strong", "", "Approval needed:"), " ", el("span", "tool-name", ev.tool_name), el("pre", "", pretty(ev.input)));
      if (this.canDecide) {
        const reason = el("textarea");
        reason.id = "reason"; reason.rows = 2; reason.cols = 50; reason.placeholder = "reason (optional)";
        box.append(reason, el("br"));
        for (const [action, label] of [["approve", "Approve"], ["deny", "Deny"]]) {
          const button = el("button", "", label);
          button.type = "button"; button.dataset.action = action;
          box.append(button, " ");
        }
      } else {
        box.append(el("p", "muted", "Someone with the permission to decide approvals must approve or deny it."));
      }
      this.waiting.replaceChildren(box);
      this.bindWaiting();
    }

    bindWaiting() {
      if (!this.waiting) return;
      const box = this.waiting.querySelector("[data-approval-id]");
      if (!box) return;
      for (const button of box.querySelectorAll("button[data-action]")) {
        button.onclick = () => {
          const reason = box.querySelector("#reason, textarea, input");
          for (const b of box.querySelectorAll("button")) b.disabled = true;
          this.send({type: button.dataset.action, approval_id: box.dataset.approvalId, reason: reason ? reason.value : ""});
        };
      }
    }

    addDecision(d) {
      if (!d || !d.approval_id) return;
      this.decided.add(d.approval_id);
      const box = this.waiting && this.waiting.querySelector("[data-approval-id]");
      if (box && box.dataset.approvalId === d.approval_id) this.clearWaiting();
      if (!this.decisions || this.decisions.querySelector(`li.decision[data-approval-id="${CSS.escape(d.approval_id)}"]`)) return;
      for (const placeholder of this.decisions.querySelectorAll(".no-decisions")) placeholder.remove();
      this.decisions.append(decisionItem(d));
    }
  }

  RunView.prototype.on = {
    "replay.truncated"() {
      // The events before this one are gone: what follows rebuilds the run from its stored steps.
      this.steps = {};
      this.log.textContent = "";
      this.clearWaiting();
    },
    // Neither clears the approval box: a replay of a waiting run starts with run.start, and the box
    // the server drew may hold a reason being typed. A decision closes its own box (addDecision).
    "run.start"(ev) { this.setStatus(ev.status); },
    "run.resume"(ev) { this.setStatus(ev.status); this.addDecision(ev.decision); },
    "step.start"(ev) { this.stepBox(ev); },
    "delta"(ev) {
      const s = this.stepBox(ev);
      if (s) s.el.querySelector(ev.kind === "reasoning" ? ".reasoning" : ".text").textContent += ev.text;
    },
    "step.end"(ev) { const s = this.stepBox(ev); if (s) s.ended = true; },
    "input"(ev) {
      // An execution that stopped before saving its model call announces the same input again.
      if ([...this.log.querySelectorAll(".input")].some((n) => n.dataset.inputId === ev.input_id)) return;
      const box = el("div", "bubble input", asText(ev.payload));
      box.dataset.inputId = ev.input_id;
      this.log.append(box);
    },
    "tool.call"(ev) { this.note("tool-call", `→ ${ev.name}`, pretty(ev.input)); },
    "tool.result"(ev) {
      if (ev.error) this.note("tool-result error", `← ${ev.name} failed`, ev.error);
      else this.note("tool-result", `← ${ev.name}`, pretty(ev.output));
    },
    "run.waiting"(ev) { this.showWaiting(ev); },
    "run.end"(ev) {
      this.settled = true;
      this.clearWaiting();
      this.setStatus(ev.status);
      if (this.error) this.error.textContent = ev.error ? `${ev.error.code}: ${ev.error.message}` : "";
      for (const d of ev.decisions || []) this.addDecision(d);
      if (ev.status === "cancelled") {
        for (const s of Object.values(this.steps)) {
          if (!s.ended) s.el.append(el("div", "cut", "— cut off here: the run was cancelled"));
        }
      }
      if (this.controls) this.controls.remove();
      this.controls = null;
    },
  };

  window.ChamviChat = {RunView, Backoff, open, pretty, asText, el};
})();
