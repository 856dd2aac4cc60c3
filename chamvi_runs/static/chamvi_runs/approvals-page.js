/* The approvals page (templates/chamvi_runs/approvals.html): decides in place, without reloading
   the page, with the arguments as the approver edited them, if they did; the page's forms work as
   they are where scripts do not run. */
import {decideApproval} from "./client.js";
import {editedArguments, el, markEdits} from "./render.js";

const page = JSON.parse(document.getElementById("chamvi-page").textContent);
const messages = () => {
  let list = document.querySelector("ul.messages");
  if (!list) {
    list = el("ul", "messages");
    document.querySelector("h1").after(list);
  }
  return list;
};

function say(kind, text) {
  messages().replaceChildren(el("li", kind, text));
}

// A decided row goes; the table with its last one, for the page's empty state.
function drop(row) {
  const table = row.closest("table");
  row.remove();
  if (table && !table.querySelector("tr.approval")) {
    table.replaceWith(el("p", "empty", "Every approval on this page is decided: reload it for those still waiting."));
    document.getElementById("listing")?.remove();
  }
}

for (const form of document.querySelectorAll("tr.approval form")) {
  form.addEventListener("submit", (submit) => {
    const button = submit.submitter;
    const approvalId = form.elements.approval_id?.value;
    if (!button || !approvalId || !["approve", "deny"].includes(button.value)) return;  // cancel: posted
    submit.preventDefault();
    const row = form.closest("tr.approval");
    let edit = {};
    try {
      if (button.value === "approve") edit = editedArguments(form);
    } catch (refusal) {
      say("error", refusal.message);
      return;
    }
    for (const b of row.querySelectorAll("button")) b.disabled = true;
    const reason = form.elements.reason?.value || "";
    // The form's own token: the csrftoken cookie may be out of a script's reach.
    const options = {reason, ...edit, base: page.base, csrfToken: form.elements.csrfmiddlewaretoken?.value};
    decideApproval(approvalId, button.value, options).then(
      () => {
        const verb = button.value === "deny" ? "Denied" : edit.arguments === undefined ? "Approved" : "Approved with your changes";
        say("success", `${verb}: ${row.dataset.toolName} of run ${row.dataset.runId}.`);
        drop(row);
      },
      (error) => {
        say("error", `Not done (${error.code}): ${error.message}`);
        if (["already_decided", "expired", "not_found"].includes(error.code)) drop(row);
        else for (const b of row.querySelectorAll("button")) b.disabled = false;
      },
    );
  });
}

markEdits(document.body, (form) => form?.querySelector("button[value=approve]"));
