"""``POST chamvi/agui/<agent>/``: an AG-UI endpoint (SPEC §15), for AG-UI front ends (CopilotKit,
``@ag-ui/client``'s ``HttpAgent``) to start, follow and decide runs without our client.

The request is an AG-UI ``RunAgentInput``; the response streams the AG-UI events of one stretch of
a run (``translate``). A request whose last message is the user's starts a run of the agent in the
thread ``threadId`` (its ``runId`` is the run's trigger id: a retried request follows the run it
started instead of starting another). A request with ``resume`` entries decides the interrupts
they answer (the run's wait points) and follows the run from there. Authentication, the policy,
the thread's owner and every cap are those of the JSON API: this is another way in, not another
set of rules. With the ``agui`` extra only (``ag-ui-protocol``); without it, a 501 says so.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.http import HttpRequest, StreamingHttpResponse
from django.http.response import HttpResponseBase

from .. import store
from ..core.storable import unstorable
from ..models import Run, WaitPoint
from ..policy import policy
from ..streaming.buffer.factory import event_log
from ..streaming.buffer.rules import MAX_SEQ
from ..streaming.serializers import decision_json, waiting_event
from ..web import views_stream
from ..web.approvals import answer, decide
from ..web.errors import ApiError
from ..web.family import Family, visible_below
from ..web.views_api import _body, _require_user, api_view, start_as

if TYPE_CHECKING:
    from .inputs import Resume, Start
    from .translate import Translator

MAX_BODY_BYTES = 4 * 1024 * 1024
"""An AG-UI client sends the whole conversation with every request; only its last message is
taken (and held to ``MAX_PAYLOAD_BYTES``), so the body may be longer than the JSON API's."""


@api_view("POST")
def run_agent(request: HttpRequest, agent: str) -> HttpResponseBase:
    if find_spec("ag_ui") is None:
        raise ApiError(501, "not_installed", "the AG-UI endpoint needs the agui extra (ag-ui-protocol)")
    from . import inputs
    from .translate import Translator

    user = _require_user(request)
    wanted = inputs.parse(_body(request, MAX_BODY_BYTES))
    resumed = Resumed()
    if isinstance(wanted, inputs.Start):
        run = _start(user, agent, wanted)
    else:
        run, resumed = _resume(user, agent, wanted)
    translator = Translator(wanted.thread, wanted.run_id, resumed.decided, resumed.pause)
    family = Family(run.pk)
    family.look(user)
    response = StreamingHttpResponse(
        _stream(run.pk, resumed, family, user, translator), content_type="text/event-stream"
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


@dataclass
class Resumed:
    """What a resume did: the seq the run's events ended at before it (what the decisions start
    comes after), the wait points it decided (``decision_json``, with ``tool_call_id``), and those
    of the same pause it left open (one question of two answered: the run still waits)."""

    after: int = 0
    decided: list[dict[str, Any]] = field(default_factory=list)
    still_open: list[dict[str, Any]] = field(default_factory=list)
    pause: list[dict[str, Any]] = field(default_factory=list)
    """Every decided wait point of the pause, this resume's and earlier ones' (``tool_call_id``,
    ``decision``): the client has their calls, and the results of those a person answered."""


def _start(user: Any, agent: str, wanted: Start) -> Run:
    if not policy().can_start(user, agent):
        raise ApiError(403, "forbidden", f"you may not start {agent}")
    return start_as(
        user, agent, wanted.text, source="agui", trigger="agui", thread=wanted.thread, id=wanted.run_id
    )


def _resume(user: Any, agent: str, wanted: Resume) -> tuple[Run, Resumed]:
    """Decide every interrupt ``wanted`` answers, all of one run of ``agent`` in its thread (or of
    the runs it delegated to), all or none: each is checked first, then they are decided in one
    transaction, which a refusal rolls back. The run the AG-UI run follows, and what was done."""
    from .inputs import approval

    ids = [d.approval_id for d in wanted.decisions]
    if len(set(ids)) != len(ids):
        raise ApiError(400, "invalid_field", "'resume' answers an interrupt twice")
    # PostgreSQL refuses a NUL or a lone surrogate in any text it is sent: no interrupt has one.
    rows = WaitPoint.objects.select_related("run").filter(
        approval_id__in=[i for i in ids if not unstorable(i)]
    )
    waits = {w.approval_id: w for w in rows}
    missing = [i for i in ids if i not in waits or not policy().can_view(user, waits[i].run)]
    if missing:
        raise ApiError(404, "not_found", f"no interrupt {missing[0]}")
    roots = {_root(w.run) for w in waits.values()}
    run = Run.objects.get(pk=next(iter(roots)))
    if len(roots) != 1 or run.agent != agent or (run.thread or wanted.thread) != wanted.thread:
        raise ApiError(
            400, "invalid_field", f"the interrupts answered are not all of one run of {agent} in this thread"
        )
    plans = []
    for decision in wanted.decisions:
        wait = waits[decision.approval_id]
        if wait.kind == WaitPoint.Kind.INPUT and not decision.resolved:
            raise ApiError(
                400, "invalid_field", f"{wait.approval_id} is a question: answer it, or cancel the run"
            )
        if wait.kind not in (WaitPoint.Kind.INPUT, WaitPoint.Kind.APPROVAL):
            raise ApiError(
                400, "invalid_field", f"{wait.approval_id} waits for a child run, not for a person"
            )
        plans.append(
            (wait, None if wait.kind == WaitPoint.Kind.INPUT else approval(decision), decision.payload)
        )
    resumed = Resumed(after=event_log().window(run.pk, MAX_SEQ).top)
    before = {w["approval_id"] for w in _open_waits(run.pk, user)}
    with transaction.atomic():
        for wait, approving, payload in plans:
            if approving is None:
                done = answer(user, wait.approval_id, payload)
            else:
                approve, reason, arguments = approving
                done = decide(user, wait.approval_id, approve, reason=reason, arguments=arguments)
            resumed.decided.append({**decision_json(done), "tool_call_id": done.tool_call_id})
    resumed.still_open = [w for w in _open_waits(run.pk, user) if w["approval_id"] in before]
    steps = {(w.run_id, w.model_step) for w in waits.values()}
    resumed.pause = [
        {"tool_call_id": call, "decision": decision}
        for run_id, step in steps
        for call, decision in WaitPoint.objects.filter(
            run_id=run_id, model_step=step, decision__isnull=False
        ).values_list("tool_call_id", "decision")
    ]
    return run, resumed


def _root(run: Run) -> str:
    """The run at the top of ``run``'s delegations (itself, when nobody delegated to it)."""
    above, _thread, _scope = store.ancestors(run)
    return above[-1] if above else run.pk


async def _stream(
    run_id: str, resumed: Resumed, family: Family, viewer: Any, translator: Translator
) -> AsyncIterator[str]:
    from .translate import WAITING

    yield translator.started()
    if resumed.still_open:
        # The decisions left the pause open: nothing will come until the rest is decided.
        yield translator.interrupted(resumed.still_open)
        return
    async for frame in views_stream._events(run_id, resumed.after, family, viewer, {}, translator.render):
        if frame != WAITING:
            if frame:
                yield frame
            continue
        waits = await views_stream._briefly(_open_waits, run_id, viewer)
        if waits:
            yield translator.interrupted(waits)
            return
        # Decided since it was announced: the run goes on, and so does this AG-UI run.
    if not translator.finished:
        yield translator.lost("the run's events ended before it did (is the run gone?)")


def _open_waits(run_id: str, viewer: Any) -> list[dict[str, Any]]:
    """The open approvals and questions of the run and of the runs below it that ``viewer`` may
    view (a child's approval stops its parent too), each as its ``run.waiting`` says it."""
    runs = [run_id, *(pk for pk, visible in visible_below(viewer, run_id).items() if visible)]
    rows = WaitPoint.objects.filter(
        run_id__in=runs, decision__isnull=True, kind__in=[WaitPoint.Kind.APPROVAL, WaitPoint.Kind.INPUT]
    ).order_by("created_at", "model_step", "call_position")
    return [{**waiting_event(w), "run_id": w.run_id} for w in rows]
