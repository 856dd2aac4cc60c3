"""The docs of conversation control (questions to the run's user, client tools, arguments edited
before approving; regenerate, resend, forks and branches) run as written: docs/agents.md's
agents.py and Python samples against the test database with a scripted model, docs/concepts.md's
texts against what the model receives and its table of branches against what the thread API
lists, and docs/http-api.md's JSON samples against what the API really sends (same keys, same
types)."""

from __future__ import annotations

import inspect
import json
import re
import shutil
import subprocess
import sys
import types
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, Literal

import pydantic
import pytest
from django.db.models.functions import Now
from django.test import Client
from django.utils import timezone

from chamvi_runs import answer, approve, cancel_run, human_tool, regenerate, resend, start_run
from chamvi_runs.core.branches import Node, current_branch, parents
from chamvi_runs.core.records import hash_token
from chamvi_runs.errors import HistoryUnavailable, InvalidAnswer
from chamvi_runs.models import Checkpoint, Run, Step, WaitPoint
from chamvi_runs.runtime.janitor import tick_once
from chamvi_runs.runtime.start_point import FORKED_BEFORE
from chamvi_runs.runtime.tool_calls import NO_ANSWER
from chamvi_runs.store import Retention, prune
from chamvi_runs.testing import ScriptedModel, ScriptedTurn
from chamvi_runs.web.wait_display import answer_form
from tests.docsamples import ROOT, block, load_module
from tests.docsamples.myapp import installed
from tests.integration.test_docs_samples import assert_same_shape
from tests.support.helpers import events, execute, make_user

pytestmark = [pytest.mark.timeout(60)]

REFUND = {"order_id": "A-1001", "amount_cents": 4599}
QUESTIONS = [
    ("ask_user", {"question": "Would you like a refund or a replacement?"}),
    ("choose_shipping", {"question": "How should the replacement ship?"}),
]


def _json(name: str) -> Any:
    return json.loads(block(name))


def _exec(name: str, namespace: dict[str, Any]) -> dict[str, Any]:
    exec(compile(block(name), f"<{name}>", "exec"), namespace)
    return namespace


def _this_run(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    start = max(n for n, m in enumerate(messages) if m["role"] == "user" and isinstance(m["content"], list))
    return messages[start:]


def asking_turn(messages: list[dict[str, Any]]) -> ScriptedTurn:
    """docs/agents.md's asking_support, as a model would drive it: look the order up, ask two
    questions in one model call, refund, close the account, report."""
    results = [m["content"] for m in _this_run(messages) if m["role"] == "tool"]
    if not results:
        return ScriptedTurn(text="Let me look.", tool_calls=[("lookup_order", {"order_id": "A-1001"})])
    if len(results) == 1:
        return ScriptedTurn(text="Two questions first.", tool_calls=QUESTIONS)
    if len(results) == 3:
        return ScriptedTurn(text="Refunding.", tool_calls=[("issue_refund", REFUND)])
    if len(results) == 4:
        return ScriptedTurn(text="Closing.", tool_calls=[("close_account", {"customer": "c-42"})])
    return ScriptedTurn(text=f"Done: {results[-1]}")


class AskingScript(ScriptedModel):
    def __init__(self) -> None:
        super().__init__(asking_turn)


@pytest.fixture
def sample(settings: Any) -> Iterator[types.ModuleType]:
    """docs/agents.md's agents.py, registered while the test runs, with the scripted model."""
    from chamvi_runs.agents.agent import registry

    settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, "MODEL": f"{__name__}.AskingScript"}
    try:
        yield load_module("docs_asking_sample", block("agents-questions"))
    finally:
        registry.unregister("asking_support")
        sys.modules.pop("docs_asking_sample", None)


@pytest.fixture
def people(django_user_model: Any) -> tuple[Any, Any]:
    """The customer who starts the runs (no permission at all) and an approver (a superuser)."""
    customer = django_user_model.objects.create_user("customer", password="pw")
    manager = django_user_model.objects.create_superuser("admin", "admin@example.com", "pw")
    return customer, manager


def _asking(customer: Any) -> Run:
    """A run of asking_support, executed until it waits on its two questions."""
    run = start_run("asking_support", {"message": "My grinder arrived broken."}, created_by=customer)
    run = execute(run)
    assert run.status == "waiting"
    return run


def _open(run: Run) -> dict[str, WaitPoint]:
    return {w.tool_name: w for w in run.waitpoints.filter(decision__isnull=True)}


def _tool_message(run: Run, waitpoint: WaitPoint) -> str:
    messages = Checkpoint.objects.get(run=run).history()
    [content] = [m["content"] for m in messages if m.get("tool_call_id") == waitpoint.tool_call_id]
    return str(content)


# --- docs/agents.md ---------------------------------------------------------------------------


def test_human_tool_table_lists_its_parameters_and_the_model_sees_the_question_tool(
    sample: types.ModuleType,
) -> None:
    text = (ROOT / "docs" / "agents.md").read_text()
    for parameter in inspect.signature(human_tool).parameters:
        assert f"| `{parameter}` |" in text, parameter
    assert sample.ask_user.schema() == _json("agents-question-tool")
    assert sample.choose_shipping.question.answer_schema == _json("agents-answer-schema")
    # A client tool's question is optional: the page's code may need none.
    assert "required" not in sample.browser_timezone.schema()["function"]["parameters"]


FORMS = {
    "text": "a line of text",
    "boolean": "Yes / No",
    "choice": "a list to choose from",
    "json": "JSON typed out",
}


def test_answer_schema_table_is_what_pydantic_and_the_pages_make_of_each_type() -> None:
    text = (ROOT / "docs" / "agents.md").read_text()
    table = text[text.index("| `answer_schema` | its JSON Schema |") :].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)`[^|]* \| ([^|]+) \|$", table, re.M)
    assert len(rows) == 6, rows
    for python_type, schema, form in rows:
        given = eval(python_type, {"Literal": Literal, "str": str, "bool": bool, "int": int, "list": list})
        made = human_tool("q", answer_schema=given).question.answer_schema  # type: ignore[union-attr]
        assert made == json.loads(schema), python_type
        assert FORMS[answer_form(made)["kind"]] == form.strip(), python_type


def test_a_model_schema_fills_its_defaults_in_the_answer() -> None:
    class Shipping(pydantic.BaseModel):
        speed: Literal["standard", "express"]
        gift_wrap: bool = False

    question = human_tool("q", answer_schema=Shipping).question
    assert question is not None
    assert question.validate({"speed": "express", "unknown": 1}) == {"speed": "express", "gift_wrap": False}


@pytest.mark.django_db(transaction=True)
def test_python_samples_answer_two_questions_then_edit_a_refund(sample: Any, people: Any) -> None:
    customer, manager = people
    run = _asking(customer)
    # The two questions of one model call wait together, each announced on its own.
    assert set(_open(run)) == {"ask_user", "choose_shipping"}
    waiting = [e for e in events(run) if e["type"] == "run.waiting"]
    assert [(e["kind"], e["tool_name"], e["question"]) for e in waiting] == [
        ("input", name, arguments["question"]) for name, arguments in QUESTIONS
    ]

    ns = _exec("agents-answer-python", {"run": run, "customer": customer, "manager": manager})
    assert ns["refused"] == ("invalid_answer", "answer: speed: Input should be 'standard' or 'express'")
    answered = {w.tool_name: w for w in run.waitpoints.filter(decision="answered")}
    assert answered["choose_shipping"].answer == {"speed": "express", "gift_wrap": False}
    assert answered["ask_user"].decided_by == customer
    run.refresh_from_db()
    assert run.status == "running"

    run = execute(run)
    assert run.status == "waiting" and set(_open(run)) == {"issue_refund"}
    # The answers are the questions' results: as text, or as JSON.
    assert _tool_message(run, answered["ask_user"]) == "A replacement, please."
    assert json.loads(_tool_message(run, answered["choose_shipping"])) == {
        "speed": "express",
        "gift_wrap": False,
    }
    results = {e["name"]: e.get("output") for e in events(run) if e["type"] == "tool.result"}
    assert results["ask_user"] == "A replacement, please."

    _exec("agents-approve-edited", ns)
    refund = run.waitpoints.get(tool_name="issue_refund")
    assert (refund.input, refund.approved_input) == (REFUND, {**REFUND, "amount_cents": 2300})

    run = execute(run)
    assert run.status == "waiting" and set(_open(run)) == {"close_account"}
    assert _tool_message(run, refund) == block("concepts-edited-note").rstrip("\n")
    [call] = [e for e in events(run) if e["type"] == "tool.call" and e["name"] == "issue_refund"]
    assert call["input"] == {**REFUND, "amount_cents": 2300}

    # close_account is Approval(editable=False): approved as proposed, or not at all.
    closing = _open(run)["close_account"]
    with pytest.raises(InvalidAnswer) as refused:
        approve(closing.approval_id, by=manager, arguments={"customer": "c-43"})
    assert refused.value.code == "not_editable"
    approve(closing.approval_id, by=manager)
    run = execute(run)
    assert run.status == "completed" and run.output == 'Done: {"closed": "c-42"}'


@pytest.mark.django_db(transaction=True)
def test_approving_the_proposal_as_arguments_is_a_plain_approval(sample: Any, people: Any) -> None:
    customer, manager = people
    run = _asking(customer)
    for name, waitpoint in _open(run).items():
        answer(
            waitpoint.approval_id, "A refund." if name == "ask_user" else {"speed": "standard"}, by=customer
        )
    run = execute(run)
    refund = _open(run)["issue_refund"]
    approve(refund.approval_id, by=manager, arguments=dict(REFUND))
    refund.refresh_from_db()
    assert refund.decision == "approved" and refund.approved_input is None
    execute(run)
    assert _tool_message(run, refund) == '{"order_id": "A-1001", "refunded_cents": 4599}'


@pytest.mark.django_db(transaction=True)
def test_an_expired_question_tells_the_model_and_never_fails_the_run(sample: Any, people: Any) -> None:
    """asking_support has on_approval_expired="fail": its expired approval fails the run, its expired
    question does not."""
    customer, _manager = people
    assert block("concepts-no-answer").strip() == NO_ANSWER
    run = _asking(customer)
    asked = _open(run)
    answer(asked["ask_user"].approval_id, "A refund, please.", by=customer)
    WaitPoint.objects.filter(pk=asked["choose_shipping"].pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert tick_once().expired == 1
    run = execute(run)
    assert run.status == "waiting" and set(_open(run)) == {"issue_refund"}
    assert _tool_message(run, asked["choose_shipping"]) == NO_ANSWER

    WaitPoint.objects.filter(run=run, tool_name="issue_refund").update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    tick_once()
    run.refresh_from_db()
    assert run.status == "failed" and run.error_code == "approval_expired"


# --- docs/http-api.md -------------------------------------------------------------------------


def _client(user: Any = None) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def _post(client: Client, path: str, body: Any) -> Any:
    return client.post(path, json.dumps(body), content_type="application/json")


@pytest.mark.django_db(transaction=True)
def test_api_json_samples_answer_and_approve_with_arguments(sample: Any, people: Any) -> None:
    customer, manager = people
    as_customer, as_manager = _client(customer), _client(manager)
    run = _asking(customer)
    detail = as_customer.get(f"/chamvi/api/runs/{run.pk}/").json()
    waits = {w["tool_name"]: w for w in detail["waits"]}
    assert [w["tool_name"] for w in detail["waits"]] == ["ask_user", "choose_shipping"]
    assert detail["waiting"] == detail["waits"][0]
    assert_same_shape(_json("api-question-waiting"), waits["choose_shipping"])
    assert set(waits["ask_user"]) == set(_json("api-question-waiting"))
    assert waits["choose_shipping"]["answer_schema"] == _json("api-question-waiting")["answer_schema"]
    shipping = f"/chamvi/api/approvals/{waits['choose_shipping']['approval_id']}"

    refused = _post(as_customer, f"{shipping}/answer/", {"answer": {"speed": "overnight"}})
    assert (refused.status_code, refused.json()) == (400, _json("api-answer-invalid"))
    # A question is its user's: an approver may neither answer it nor approve it.
    assert _post(as_manager, f"{shipping}/answer/", _json("api-answer-request")).status_code == 403
    wrong = _post(as_manager, f"{shipping}/approve/", {})
    assert (wrong.status_code, wrong.json()["error"]["code"]) == (409, "wrong_kind"), wrong.content

    answered = _post(as_customer, f"{shipping}/answer/", _json("api-answer-request"))
    assert answered.status_code == 200, answered.content
    assert_same_shape(_json("api-answer-response"), answered.json())
    assert answered.json()["answer"] == _json("api-answer-response")["answer"]
    again = _post(as_customer, f"{shipping}/answer/", _json("api-answer-request"))
    assert (again.status_code, again.json()["error"]["code"]) == (409, "already_decided")

    # The notifier's link answers with the wait point's token, and records no user.
    token_wait = WaitPoint.objects.get(approval_id=waits["ask_user"]["approval_id"])
    WaitPoint.objects.filter(pk=token_wait.pk).update(token_hash=hash_token("the-link-token"))
    by_token = _post(
        _client(),
        f"/chamvi/api/approvals/{token_wait.approval_id}/answer/",
        {"answer": "A refund, please.", "token": "the-link-token"},
    )
    assert by_token.status_code == 200, by_token.content
    assert by_token.json()["decided_by"] is None

    run = execute(run)
    assert run.status == "waiting"
    refund = as_manager.get(f"/chamvi/api/runs/{run.pk}/").json()["waiting"]
    assert (refund["tool_name"], refund["editable"]) == ("issue_refund", True)
    decide = f"/chamvi/api/approvals/{refund['approval_id']}"
    # The run's creator may answer its questions, not its approvals.
    wrong = _post(as_customer, f"{decide}/answer/", {"answer": "yes"})
    assert (wrong.status_code, wrong.json()["error"]["code"]) == (409, "wrong_kind")
    bad = _post(as_manager, f"{decide}/approve/", {"arguments": {**REFUND, "amount_cents": "lots"}})
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_arguments")
    assert "amount_cents" in bad.json()["error"]["message"]

    request = _json("api-approve-arguments-request")
    edited = _post(as_manager, f"{decide}/approve/", request)
    assert edited.status_code == 200, edited.content
    assert_same_shape(_json("api-approve-arguments-response"), edited.json())
    assert (edited.json()["input"], edited.json()["approved_input"]) == (REFUND, request["arguments"])

    run = execute(run)
    closing = as_manager.get(f"/chamvi/api/runs/{run.pk}/").json()["waiting"]
    assert (closing["tool_name"], closing["editable"]) == ("close_account", False)
    close = f"/chamvi/api/approvals/{closing['approval_id']}/approve/"
    locked = _post(as_manager, close, {"arguments": {"customer": "c-43"}})
    assert (locked.status_code, locked.json()["error"]["code"]) == (400, "not_editable")
    assert _post(as_manager, close, {}).status_code == 200
    assert execute(run).status == "completed"

    decisions = {
        d["tool_name"]: d for d in as_customer.get(f"/chamvi/api/runs/{run.pk}/").json()["decisions"]
    }
    asked, refunded = _json("api-decisions")
    assert_same_shape(asked, decisions["ask_user"])
    assert_same_shape(refunded, decisions["issue_refund"])
    assert decisions["choose_shipping"]["decided_by"] == "customer"
    assert decisions["ask_user"]["decided_by"] is None  # answered with the token
    assert decisions["issue_refund"]["approved_input"] == request["arguments"]
    # run.resume carries the same decision JSON.
    resumed = [e["decision"] for e in events(run) if e["type"] == "run.resume" and e.get("decision")]
    assert_same_shape(refunded, next(d for d in resumed if d["tool_name"] == "issue_refund"))


# --- regenerate, resend, forks and branches (docs/agents.md, concepts.md, http-api.md) --------------


def replying_turn(messages: list[dict[str, Any]]) -> ScriptedTurn:
    """asking_support answering a plain message: look the order up (step 0, its result step 1),
    then answer (step 2) with how long the conversation was, so that each answer is its own."""
    if not [m for m in _this_run(messages) if m["role"] == "tool"]:
        return ScriptedTurn(text="Let me look.", tool_calls=[("lookup_order", {"order_id": "A-1001"})])
    return ScriptedTurn(text=f"Answered after {len(messages)} messages.")


class ReplyingScript(ScriptedModel):
    def __init__(self) -> None:
        super().__init__(replying_turn)


@pytest.fixture
def replying(settings: Any) -> Iterator[types.ModuleType]:
    """docs/agents.md's agents.py with a model that answers each message after one lookup."""
    from chamvi_runs.agents.agent import registry

    settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, "MODEL": f"{__name__}.ReplyingScript"}
    try:
        yield load_module("docs_replying_sample", block("agents-questions"))
    finally:
        registry.unregister("asking_support")
        sys.modules.pop("docs_replying_sample", None)


def _history(run: Run | str, index: int | None = None) -> list[dict[str, Any]]:
    checkpoint = Checkpoint.objects.get(run_id=run if isinstance(run, str) else run.pk)
    return checkpoint.history(index)


def _settled(run: Run) -> Run:
    run = execute(run)
    assert run.status == "completed", (run.status, run.error_code, run.error_message)
    return run


def _said(customer: Any, message: str) -> Run:
    return _settled(
        start_run(
            "asking_support", {"message": message}, thread=f"support-{customer.pk}", created_by=customer
        )
    )


@pytest.mark.django_db(transaction=True)
def test_python_samples_regenerate_resend_and_fork_a_thread(replying: Any, people: Any) -> None:
    customer, _manager = people
    first = _said(customer, "My grinder arrived broken.")
    run = _said(customer, "It grinds unevenly too.")
    assert _history(run, -1) == _history(first)

    ns = _exec("agents-regenerate", {"run": run, "customer": customer})
    again = _settled(ns["again"])
    assert again.trigger["payload"] == run.trigger["payload"] and again.created_by == customer
    # The same history to answer from, the same message: the model answers it again.
    assert _history(again, 0)[:-1] == _history(run, 0)[:-1]  # all but the model's new answer
    assert _history(again, -1) == _history(first)

    edited = _settled(_exec("agents-resend", ns)["edited"])
    assert edited.replaces_id == run.pk
    assert edited.trigger["payload"] == {"message": "My grinder arrived broken. A refund, not a replacement."}
    assert _history(edited, -1) == _history(first)
    # The thread goes on from the newest of them, never from `run` or `again`.
    later = _said(customer, "When will it arrive?")
    assert _history(later, -1) == _history(edited)

    fork = _settled(_exec("agents-fork", ns)["fork"])
    looked_up = _history(run, 1)
    assert looked_up[-1]["role"] == "tool" and _history(fork, -1) == looked_up

    # A fork after the model call whose lookup had not run: the call is closed for the model.
    assert block("concepts-forked-before").strip() == FORKED_BEFORE
    early = _settled(
        start_run("asking_support", "Hello?", thread=run.thread, created_by=customer, from_step=(run.pk, 0))
    )
    opening = _history(early, -1)
    assert opening[:-1] == _history(run, 0)
    assert opening[-1]["role"] == "tool" and opening[-1]["content"] == FORKED_BEFORE

    # The replaced run stays readable, and names the newest run that replaced it.
    detail = _client(customer).get(f"/chamvi/api/runs/{run.pk}/").json()
    assert (detail["status"], detail["replaced_by"], detail["output"]) == ("completed", edited.pk, run.output)
    assert detail["steps_page"]["total"] == 3

    active = start_run("asking_support", "Anyone?", thread=run.thread, created_by=customer)
    runs = Run.objects.count()
    ns = _exec("agents-again-refused", {**ns, "active": active})
    assert "has no step 99" in ns["missing"] and Run.objects.count() == runs
    # A run that saved no step has no history to start from again.
    assert cancel_run(active.pk) == "cancelled"
    with pytest.raises(HistoryUnavailable):
        regenerate(active.pk, by=customer)
    assert Run.objects.count() == runs


BRANCH_ROW = re.compile(r"^\| (.+?) \| (.+?) \|$", re.M)


def _branch_table() -> list[tuple[str, list[str]]]:
    text = (ROOT / "docs" / "concepts.md").read_text()
    table = text[text.index("<!-- branches:") :].split("\n\n", 1)[0]
    rows = BRANCH_ROW.findall(table)[2:]  # the header and its rule
    assert len(rows) >= 5, rows
    return [(action, re.findall(r"`(\w+)`", branch)) for action, branch in rows]


def _carry_out(action: str, runs: dict[str, Run], customer: Any) -> list[tuple[str, Node]]:
    """The runs one row of the table starts (for real), as the branch sees them."""
    thread = f"support-{customer.pk}"

    def new(name: str, **fork: Any) -> Run:
        return start_run("asking_support", {"message": name}, thread=thread, created_by=customer, **fork)

    if match := re.fullmatch(r"then `(\w+)`, a (regenerate|resend) of `(\w+)`", action):
        name, kind, old = match.groups()
        runs[name] = (
            regenerate(runs[old].pk, by=customer)
            if kind == "regenerate"
            else resend(runs[old].pk, {"message": name}, by=customer)
        )
        return [(name, Node(name, replaces=old))]
    if match := re.fullmatch(r"then `(\w+)`, a fork (?:after|from) step (-?\d+) of `(\w+)`", action):
        name, step, old = match.groups()
        runs[name] = new(name, from_step=(runs[old].pk, int(step)))
        return [(name, Node(name, forked_from=old, from_start=step == "-1"))]
    if match := re.fullmatch(r"then `(\w+)`, a new run", action):
        runs[match[1]] = new(match[1])
        return [(match[1], Node(match[1]))]
    names = re.findall(r"`(\w+)`", action)
    assert names and re.fullmatch(r"(`\w+`(, )?)+", action), action
    for name in names:
        runs[name] = _settled(new(name))
    return [(name, Node(name)) for name in names]


@pytest.mark.django_db(transaction=True)
def test_the_branches_of_concepts_are_what_the_thread_api_lists(replying: Any, people: Any) -> None:
    """Each row of docs/concepts.md's table, done for real: the thread JSON's branch is the one the
    table gives (and core.branches too), and each new run starts from the history of its parent on
    the branch (its final history, or the step a fork names)."""
    customer, _manager = people
    as_customer = _client(customer)
    runs: dict[str, Run] = {}
    nodes: list[Node] = []
    for action, expected in _branch_table():
        for name, node in _carry_out(action, runs, customer):
            nodes.append(node)
            run = _settled(runs[name])
            runs[name] = run
            if node.forked_from is not None and not node.from_start:
                start = _history(runs[node.forked_from], run.base_step)
            else:
                parent = parents(nodes)[name]
                start = _history(runs[parent]) if parent is not None else []
            assert _history(run, -1) == start, action
        assert current_branch(nodes) == expected, action
        thread = as_customer.get(f"/chamvi/api/threads/support-{customer.pk}/").json()
        names = {r.pk: n for n, r in runs.items()}
        assert [names[r["id"]] for r in thread["branch"]] == expected, action
        assert [names[i] for i in thread["replaced"]] == [n.id for n in nodes if n.id not in expected], action
        assert thread["branch_page"] == {"total": len(expected), "earlier": False}


@pytest.fixture
def support_site(settings: Any) -> Iterator[None]:
    """The README's support agent and scripted model, which docs/http-api.md's samples name."""
    with installed():
        settings.CHAMVI_RUNS = {**settings.CHAMVI_RUNS, "MODEL": "myapp.scripted.SupportScript"}
        yield


def _approved(run_id: str, as_manager: Client) -> Run:
    """Execute a run of the README's support agent through its refund's approval."""
    run = execute(run_id)
    assert run.status == "waiting"
    waiting = run.waitpoints.get(decision=None)
    assert _post(as_manager, f"/chamvi/api/approvals/{waiting.approval_id}/approve/", {}).status_code == 200
    return _settled(run)


def _code(response: Any) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


@pytest.mark.django_db(transaction=True)
def test_api_json_samples_regenerate_resend_fork_and_list_the_thread(support_site: Any, people: Any) -> None:
    _customer, manager = people
    as_manager = _client(manager)
    started = _post(as_manager, "/chamvi/api/runs/", _json("api-start-request"))
    assert started.status_code == 201, started.content
    first = started.json()["id"]
    assert execute(first).status == "waiting"

    regenerate_first = f"/chamvi/api/runs/{first}/regenerate/"
    active = _post(as_manager, regenerate_first, {})
    sample_id = "run_2bq0vYzH6mN4kR8sT1uW"
    expected = json.loads(block("api-run-active").replace(sample_id, first))
    assert (active.status_code, active.json()) == (409, expected)
    waiting = Run.objects.get(pk=first).waitpoints.get(decision=None)
    assert _post(as_manager, f"/chamvi/api/approvals/{waiting.approval_id}/approve/", {}).status_code == 200
    _settled(Run.objects.get(pk=first))

    assert _code(_post(as_manager, regenerate_first, {"payload": "x"})) == (400, "invalid_field")
    regenerated = _post(as_manager, regenerate_first, {})
    assert regenerated.status_code == 201, regenerated.content
    assert_same_shape(_json("api-run-response"), regenerated.json())
    lineage = json.loads(block("api-regenerate-lineage").replace(sample_id, first))
    assert {key: regenerated.json()[key] for key in lineage} == lineage
    again = regenerated.json()["id"]
    assert as_manager.get(f"/chamvi/api/runs/{first}/").json()["replaced_by"] == again
    _approved(again, as_manager)

    resend_first = f"/chamvi/api/runs/{first}/resend/"
    assert _code(_post(as_manager, resend_first, {})) == (400, "invalid_field")
    resent = _post(as_manager, resend_first, _json("api-resend-request"))
    assert resent.status_code == 201, resent.content
    edited = resent.json()
    assert (
        edited["replaces"] == first and edited["trigger"]["payload"] == _json("api-resend-request")["payload"]
    )
    assert as_manager.get(f"/chamvi/api/runs/{first}/").json()["replaced_by"] == edited["id"]
    _approved(edited["id"], as_manager)

    request = json.loads(block("api-fork-request").replace(sample_id, edited["id"]))
    forked = _post(as_manager, "/chamvi/api/runs/", request)
    assert forked.status_code == 201, forked.content
    assert_same_shape(_json("api-run-response"), forked.json())
    assert forked.json()["forked_from"] == {"run_id": edited["id"], "step": 1}
    for bad, refusal in [
        ([edited["id"], 99], (409, "history_unavailable")),
        (["run_nobody_has_this_id", 1], (404, "not_found")),
        ([edited["id"]], (400, "invalid_field")),
        ([edited["id"], -2], (400, "invalid_field")),
    ]:
        assert _code(_post(as_manager, "/chamvi/api/runs/", {**request, "from_step": bad})) == refusal, bad

    thread = as_manager.get("/chamvi/api/threads/customer-42/")
    assert thread.status_code == 200, thread.content
    sample = _json("api-thread-response")
    assert_same_shape(sample, thread.json())
    body = thread.json()
    assert [r["id"] for r in body["branch"]] == [edited["id"], forked.json()["id"]]
    assert body["replaced"] == [first, again]
    assert body["branch_page"] == {"total": 2, "earlier": False}
    for summary in body["branch"]:
        assert set(summary) == set(sample["branch"][0])
    assert body["branch"][0]["replaces"] == first
    assert as_manager.get("/chamvi/api/threads/no-such-thread/").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_who_may_regenerate_resend_and_fork_over_http(support_site: Any, people: Any) -> None:
    """docs/security.md: steering and starting for a regenerate or a resend, viewing the source
    run for a fork."""
    customer, manager = people
    add = make_user("adder", "add_run")
    viewer = make_user("viewer", "view_run", "add_run")
    steerer = make_user("steerer", "view_run", "change_run")
    staff = make_user("staff", "view_run", "change_run", "add_run")
    started = _post(_client(customer), "/chamvi/api/runs/", {"agent": "support", "payload": "x"})
    assert started.status_code == 403  # the customer may not start runs at all
    run = start_run("support", "Order A-1001 arrived broken.", thread="t-1", created_by=manager)
    run = _approved(run.pk, _client(manager))
    again = f"/chamvi/api/runs/{run.pk}/regenerate/"
    assert _code(_post(_client(add), again, {})) == (404, "not_found")
    assert _code(_post(_client(viewer), again, {})) == (403, "forbidden")
    assert _code(_post(_client(steerer), again, {})) == (403, "forbidden")
    regenerated = _post(_client(staff), again, {})
    assert regenerated.status_code == 201, regenerated.content
    assert regenerated.json()["created_by"] == manager.pk
    fork = {"agent": "support", "payload": "y", "from_step": [run.pk, 1]}
    assert _code(_post(_client(add), "/chamvi/api/runs/", fork)) == (404, "not_found")
    assert _post(_client(viewer), "/chamvi/api/runs/", fork).status_code == 201


@pytest.mark.django_db(transaction=True)
def test_a_history_stored_before_0008_is_known_after_its_last_step_only(replying: Any, people: Any) -> None:
    """docs/upgrading.md: a history a previous release stored whole can be forked from its run's
    last step, and from nowhere else (regenerate and resend start before the first step)."""
    customer, manager = people
    run = _said(customer, "My grinder arrived broken.")
    final = _history(run)
    # What rows of the previous release hold: no parts, the whole history at the last step.
    Step.objects.filter(run=run).update(messages=None)
    Checkpoint.objects.filter(run=run).update(
        whole_step=None, whole_length=None, length=None, opening_length=None
    )
    assert _history(run) == final
    for again in (lambda: regenerate(run.pk, by=customer), lambda: resend(run.pk, "x", by=customer)):
        with pytest.raises(HistoryUnavailable):
            again()
    refused = _post(_client(manager), f"/chamvi/api/runs/{run.pk}/regenerate/", {})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "history_unavailable"
    with pytest.raises(HistoryUnavailable):
        start_run("asking_support", "x", thread=run.thread, created_by=customer, from_step=(run.pk, 0))
    last = Checkpoint.objects.get(run=run).step_index
    fork = _settled(
        start_run("asking_support", "x", thread=run.thread, created_by=customer, from_step=(run.pk, last))
    )
    assert _history(fork, -1) == final


@pytest.mark.django_db(transaction=True)
def test_a_fork_starts_from_a_run_the_prune_keeps_else_fails_history_unavailable(
    replying: Any, people: Any
) -> None:
    """docs/concepts.md's error code history_unavailable: chamvi_prune keeps the run a queued fork
    starts from; deleted anyway (a delete racing with the start, or made outside the prune), the
    fork fails instead of starting from another history."""
    customer, _manager = people
    source = _settled(start_run("asking_support", "My grinder arrived broken.", created_by=customer))
    fork = start_run("asking_support", "x", created_by=customer, from_step=(source.pk, 1))
    Run.objects.filter(pk=source.pk).update(finished_at=Now() - timedelta(days=40))
    assert prune(Retention(older_than=timedelta(days=30))).rows["Run"] == 0
    # What a racing delete leaves: the run's rows gone, the fork's reference to it dangling.
    for model in (Step, Checkpoint):
        model.objects.filter(run_id=source.pk).delete()
    Run.objects.filter(pk=source.pk)._raw_delete(Run.objects.db)
    fork = execute(fork)
    assert (fork.status, fork.error_code) == ("failed", "history_unavailable")


CLIENT_TOOL_HARNESS = """
import {readFileSync} from "node:fs";
import {connectRun} from "%(client)s";
import {FakeWebSocket, LOCATION, fastBackoff, waitFor} from "%(fakes)s";

const options = {WebSocket: FakeWebSocket, location: LOCATION, backoff: fastBackoff()};
const client = connectRun("run_locale", options);
const socket = FakeWebSocket.last;
socket.open();
const sample = readFileSync(process.argv[2], "utf8");
const AsyncFunction = Object.getPrototypeOf(async function () {}).constructor;
await new AsyncFunction("client", "navigator", sample)(client, {language: "fr-FR"});
socket.message({type: "run.start", run_id: "run_locale", seq: 1, status: "running"});
socket.message({
  type: "run.waiting", run_id: "run_locale", seq: 2, approval_id: "apr_locale", kind: "input",
  tool_name: "browser_locale", input: {question: ""}, question: null, answer_schema: null, client: true,
  editable: false, expires_at: null,
});
await waitFor(() => socket.sent.length === 1, "the answer");
console.log(JSON.stringify(socket.sent));
client.close();
"""


@pytest.mark.timeout(60)
def test_the_client_tool_sample_answers_the_question_with_the_browsers_locale(tmp_path: Any) -> None:
    """docs/chat-client.md's client tool, run by Node on the real client.js: the page's code answers
    the run's question of the test agents' ``browser_locale`` tool, without the user."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    harness = tmp_path / "harness.mjs"
    harness.write_text(
        CLIENT_TOOL_HARNESS
        % {
            "client": (ROOT / "chamvi_runs" / "static" / "chamvi_runs" / "client.js").as_uri(),
            "fakes": (ROOT / "tests" / "js" / "fakes.mjs").as_uri(),
        }
    )
    code = tmp_path / "sample.js"
    code.write_text(block("chat-client-tool"))
    done = subprocess.run(
        [node, str(harness), str(code)], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sent = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(sent) == 1 and sent[0]["type"] == "answer" and sent[0]["approval_id"] == "apr_locale"
    assert sent[0]["answer"]["locale"] == "fr-FR" and sent[0]["answer"]["time_zone"]
