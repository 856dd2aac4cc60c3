// Drives chamvi_runs's AG-UI endpoint with @ag-ui/client's HttpAgent, as an AG-UI front end does:
// a user message, the run's interrupt, a resume that approves it. Prints one JSON line per AG-UI
// run: the event types the client applied, its pending interrupts, its messages and the result.
// tests/system/test_agui_client.py runs it against daphne and a worker.
//
//   node drive.mjs <client package dir> <endpoint url> <bearer token> <thread id>
import {pathToFileURL} from "node:url";
import {join} from "node:path";

const [packageDir, url, token, threadId] = process.argv.slice(2);
const {HttpAgent} = await import(pathToFileURL(join(packageDir, "node_modules/@ag-ui/client/dist/index.mjs")).href);

const agent = new HttpAgent({url, headers: {Authorization: `Bearer ${token}`}, threadId});
let types = [];
const subscriber = {onEvent({event}) { types.push(event.type); }};

function report(phase, result) {
  console.log(JSON.stringify({
    phase,
    types,
    result: result.result ?? null,
    interrupts: agent.pendingInterrupts,
    messages: agent.messages.map(({role, content, toolCalls, toolCallId}) => ({role, content, toolCalls, toolCallId})),
  }));
  types = [];
}

agent.addMessage({id: "user-1", role: "user", content: "Refund order o-1, please."});
report("asked", await agent.runAgent({runId: `${threadId}-1`}, subscriber));
const [interrupt] = agent.pendingInterrupts;
const resume = [{interruptId: interrupt.id, status: "resolved", payload: {approved: true, reason: "photos checked"}}];
report("resumed", await agent.runAgent({runId: `${threadId}-2`, resume}, subscriber));
