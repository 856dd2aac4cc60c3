// What a site writes against client.d.ts: `tsc -p tests/js/types` fails if the declarations drift
// from what this uses (each @ts-expect-error line must stay an error, the rest must type-check).
import {
  ChamviError,
  connectRun,
  connectThread,
  decideApproval,
  type Item,
  type RunEvent,
  type RunState,
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
      // @ts-expect-error a wait names its approval, not a decision
      event.decision;
      return `waiting for ${approval} (${event.tool_name}) until ${expires ?? "never"}`;
    }
    case "run.resume":
      return event.decision ? `${event.decision.decision} by ${event.decision.decided_by ?? "nobody"}` : "resumed";
    case "tool.result":
      // @ts-expect-error a tool's result is `output` (or `error`), there is no `result`
      return String(event.result);
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
      return `${item.decision}: ${item.reason}`;
  }
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
}

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
void decide();
