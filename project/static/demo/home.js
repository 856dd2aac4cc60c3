/* The demo's home page: starts a run of the "support" agent and opens its page. */
const form = document.getElementById("start");
form?.addEventListener("submit", async (submit) => {
  submit.preventDefault();
  const csrf = form.elements.csrfmiddlewaretoken.value;
  const response = await fetch(form.dataset.api, {
    method: "POST",
    headers: {"Content-Type": "application/json", "X-CSRFToken": csrf},
    body: JSON.stringify({agent: "support", payload: {message: document.getElementById("text").value}}),
  });
  const run = await response.json();
  if (response.ok) location.href = form.dataset.runUrl.replace("RUN_ID", encodeURIComponent(run.id));
  else alert(run.error.message);
});
