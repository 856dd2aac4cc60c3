// What a site writes against client.d.ts: `tsc -p tests/js/types` fails if the declarations drift
// from what this uses (each @ts-expect-error line must stay an error, the rest must type-check).
import {
  ChamviError,
  answerQuestion,
  connectRun,
  connectThread,
  currentBranch,
  decideApproval,
  regenerateRun,
  resendRun,
  type ForkPoint,
  type Item,
  type Json,
  type RunEvent,
  type RunState,
  type Waiting,
} from "../../../chamvi_runs/static/chamvi_runs/client.js";

const client = connectRun("run_2bq0", {after: 0, csrfToken: () => "tok", backoff: {initial: 250}});
// A page's {% csrf_token %} field, where the cookie is out of a script's reach; undefined keeps the cookie.
const field = document.querySelector<HTMLInputElement>("input[name=csrfmiddlewaretoken]");
connectRun("run_2bq0", {csrfToken: field?.value, transport: "sse", WebSocket: null}).close();

function describe(event: RunEvent): string {
  switch (event.type) {
    case "delta": {
      const text: string = event.text;
      const kind: "text" | "reasoning" = event.kind;
      return `${kind} of step ${event.step}#${event.attempt}: ${text}`;
    }
    case "run.waiting": {
      const approval: string = event.approval_id;
      const expires: string | null = event.expires_at;
      if (event.kind === "input") return `asks ${event.question ?? event.tool_name}${event.client ? " (client tool)" : ""}`;
      const editable: boolean = event.editable;
      console.log(editable, event.answer_schema);
      // @ts-expect-error a wait names its approval, not a decision
      event.decision;
      return `waiting for ${approval} (${event.tool_name}) until ${expires ?? "never"}`;
    }
    case "run.resume":
      return event.decision ? `${event.decision.decision} by ${event.decision.decided_by ?? "nobody"}` : "resumed";
    case "tool.result":
      // @ts-expect-error a tool's result is `output` (or `error`), there is no `result`
      return String(event.result);
    case "run.start": {
      const replaces: string | null = event.replaces;
      const fork: ForkPoint | null = event.forked_from;
      // @ts-expect-error a fork point names its step by index
      const step: string = event.forked_from?.step ?? "";
      return `started${replaces ? ` again, for ${replaces}` : ""}${fork ? ` from ${fork.run_id}#${fork.step}` : ""}${step}`;
    }
    case "run.end":
      return `${event.status}: ${event.usage.output_tokens} tokens, ${event.decisions.length} decisions`;
    case "replay.truncated":
      return `rebuilt from step ${event.from_step}`;
    default:
      // @ts-expect-error only delta has text
      return event.text;
  }
}

function show(item: Item): string {
  switch (item.kind) {
    case "message":
      return item.finish_reason === null ? `${item.text}…` : item.text;
    case "tool":
      return item.done ? `${item.name} → ${JSON.stringify(item.output)}` : `${item.name}…`;
    case "input":
      return JSON.stringify(item.payload);
    case "decision":
      // The wait point's own kind is wait_kind: an item's kind is "decision".
      if (item.wait_kind === "input") return `answered: ${JSON.stringify(item.answer)}`;
      return `${item.decision}: ${item.reason}${item.approved_input === null ? "" : " (edited)"}`;
  }
}

/** A page's question box: every open question of the run, the first approval apart. */
function questions(state: RunState): Waiting[] {
  const approval: Waiting | undefined = state.waits.find((wait) => wait.kind === "approval");
  console.log(approval?.editable, state.waiting?.approval_id);
  // @ts-expect-error a wait's kind is "approval" or "input"
  state.waits.filter((wait) => wait.kind === "question");
  return state.waits.filter((wait) => wait.kind === "input" && !wait.client);
}

client.on("delta", (event, state: RunState) => {
  const text: string = event.text;
  console.log(text, state.message(event.step)?.text);
});
client.on("run.waiting", (event) => {
  console.log(event.approval_id);
  // @ts-expect-error run.waiting's listener gets a RunWaitingEvent, which has no text
  console.log(event.text);
});
client.on("event", (event) => console.log(describe(event)));
client.on("change", (state) => console.log(state.items.map(show), state.waiting?.approval_id, state.end?.status));
client.on("connection", ({status, delay, error}) => console.log(status, delay, error?.code));
client.on("reply", (reply) => console.log(reply.type === "error" ? reply.code : reply.action));
// @ts-expect-error no such listener
client.on("deltas", () => {});

async function decide(): Promise<void> {
  try {
    const ack = await client.approve({reason: "photos checked"});
    const id: string = ack.approval_id;
    const input = await client.input({text: "The box was damaged too."});
    const inputId: string = input.input_id;
    const cancelled = await client.cancel();
    // @ts-expect-error a cancel's ack has a status, not an input_id
    cancelled.input_id;
    console.log(id, inputId, cancelled.status);
  } catch (error) {
    if (error instanceof ChamviError) console.log(error.code, error.status ?? "over the websocket");
  }
  // @ts-expect-error approve takes an options object, not the approval id
  await client.approve("apr_9XkQ");
  const edited = await client.approve({arguments: {order_id: "A-1001", amount_cents: 2000}, reason: "half"});
  console.log(edited.approval_id);
  // @ts-expect-error edited arguments are an object of the tool's arguments
  await client.approve({arguments: [1, 2]});
  const answered = await client.answer({answer: {size: "M"}});
  const action: "answer" = answered.action;
  await client.answer({approvalId: "apr_size", answer: null});
  // @ts-expect-error an answer is given
  await client.answer({approvalId: "apr_size"});
  console.log(action, questions(client.state).length);
}

// The page's own code answers its client tools' questions: what the handler returns is the answer.
const offLocation = client.onClientTool("get_location", async (input: Json, waiting: Waiting) => {
  console.log(input, waiting.approval_id);
  return {city: "Lyon"};
});
offLocation();
client.onClientTool("confirm_dialog", () => window.confirm("Go on?"));
// @ts-expect-error a handler's answer is JSON
client.onClientTool("now", () => new Date());

// A script (Node 22+, Deno) with an API token: no session, no CSRF token, no page to take the host from.
const script = connectRun("run_2bq0", {
  token: "chv_0123456789",
  location: {protocol: "https:", host: "example.com"},
  base: "https://example.com/chamvi/",
});
script.on("connection", ({error}) => {
  if (error?.code === "unauthenticated") console.log("the token was deleted");
});
// @ts-expect-error a token is a string
connectRun("run_2bq0", {token: 42});

const thread = connectThread("customer-42");
thread.on("run", (state) => console.log(state.run_id, state.status));
const staffView = connectThread("customer-42", {scope: "user:7"});
console.log(staffView.scope);
// @ts-expect-error a scope is a string
connectThread("customer-42", {scope: 7});
void thread.input("run_2bq0", "hello");
// @ts-expect-error on a thread, input names its run
void thread.input("hello");
void decideApproval("apr_9XkQ", "deny", {reason: "no", token: "t0k"}).then((point) => {
  const decision: "approved" | "denied" = point.decision;
  console.log(decision, point.run_id);
});
// @ts-expect-error a decision is "approve" or "deny"
void decideApproval("apr_9XkQ", "approved");
void decideApproval("apr_9XkQ", "approve", {arguments: {amount_cents: 2000}});
void answerQuestion("apr_size", "M", {token: "t0k"}).then((point) => {
  const decision: "answered" = point.decision;
  console.log(decision, point.answer);
});
// @ts-expect-error an answer has no reason
void answerQuestion("apr_size", "M", {reason: "x"});
void thread.answer({approvalId: "apr_size", answer: "M"});
void thread.approve("apr_9XkQ", {arguments: {amount_cents: 1}});
// @ts-expect-error on a thread, an answer names its question
void thread.answer({answer: "M"});
thread.onClientTool("get_location", () => ({city: "Lyon"}));
void decide();

// Regenerate, edit and resend, and the thread's branches (SPEC §12).
async function answerAgain(): Promise<void> {
  const regenerated = await client.regenerate();
  const newRun: string = regenerated.run_id;
  const replaced: string = regenerated.replaces;
  await client.regenerate({runId: "run_older"});
  const resent = await client.resend({payload: {message: "Make it shorter."}});
  const action: "resend" = resent.action;
  // @ts-expect-error a resend gives its payload
  await client.resend({});
  await thread.regenerate({runId: "run_2bq0"});
  // @ts-expect-error on a thread, a regenerate names its run
  await thread.regenerate({});
  await thread.resend({runId: "run_2bq0", payload: "hello"});
  const json = await regenerateRun("run_2bq0", {base: "/chamvi/"});
  const replaces: string | null = json.replaces;
  const fork: ForkPoint | null = json.forked_from;
  await resendRun("run_2bq0", {message: "x"}, {token: "chv_0123456789"});
  // @ts-expect-error resendRun takes the payload
  await resendRun("run_2bq0");
  console.log(newRun, replaced, action, json.id, replaces, fork?.step, client.state.replaced_by);
}
const everyBranch = connectThread("customer-42", {allBranches: true});
everyBranch.on("branch", (ids, state) => console.log(ids.join(","), state.runsOnBranch().length));
const shownRuns: RunState[] = everyBranch.runs();
console.log(shownRuns.map((run) => `${run.run_id} ${run.replaces ?? ""} ${run.forked_from?.run_id ?? ""}`));
const branchIds: readonly string[] = thread.state.branch;
console.log(branchIds, thread.state.list({allBranches: true}).length, thread.state.onBranch("run_2bq0"));
const computed: string[] = currentBranch([
  {id: "a"},
  {id: "b", replaces: "a"},
  {run_id: "c", forked_from: {run_id: "a", step: -1}},
  ...thread.state.runs.values(),
]);
console.log(computed);
// @ts-expect-error a run of a branch has an id
currentBranch([{replaces: "a"}]);
// @ts-expect-error allBranches is a boolean
connectThread("customer-42", {allBranches: "yes"});
void answerAgain();
