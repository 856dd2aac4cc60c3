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
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from django.http import HttpRequest, StreamingHttpResponse
from django.http.response import HttpResponseBase

from ..models import Run, WaitPoint
from ..policy import policy
from ..streaming.buffer.factory import event_log
from ..streaming.serializers import decision_json, waiting_event
from ..web import views_stream
from ..web.approvals import answer, decide
from ..web.errors import ApiError
from ..web.family import Family
from ..web.views_api import _body, _require_user, api_view, start_as

if TYPE_CHECKING:
    from .inputs import Resume, Start
    from .translate import Translator

MAX_BODY_BYTES = 4 * 1024 * 1024
"""An AG-UI client sends the whole conversation with every request; only its last message is
taken (and held to ``MAX_PAYLOAD_BYTES``), so the body may be longer than the JSON API's."""

SEQ_CEILING = 10**12


@api_view("POST")
def run_agent(request: HttpRequest, agent: str) -> HttpResponseBase:
    if find_spec("ag_ui") is None:
        raise ApiError(501, "not_installed", "the AG-UI endpoint needs the agui extra (ag-ui-protocol)")
    from . import inputs
    from .translate import Translator

    user = _require_user(request)
    wanted = inputs.parse(_body(request, MAX_BODY_BYTES))
    decided: list[dict[str, Any]] = []
    if isinstance(wanted, inputs.Start):
        run, after = _start(user, agent, wanted), 0
    else:
        run, after, decided = _resume(user, agent, wanted)
    translator = Translator(wanted.thread, wanted.run_id, decided)
    family = Family(run.pk)
    family.look(user)
    response = StreamingHttpResponse(
        _stream(run.pk, after, family, user, translator), content_type="text/event-stream"
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


def _start(user: Any, agent: str, wanted: Start) -> Run:
    if not policy().can_start(user, agent):
        raise ApiError(403, "forbidden", f"you may not start {agent}")
    return start_as(
        user, agent, wanted.text, source="agui", trigger="agui", thread=wanted.thread, id=wanted.run_id
    )


def _resume(user: Any, agent: str, wanted: Resume) -> tuple[Run, int, list[dict[str, Any]]]:
    """Decide every interrupt ``wanted`` answers, all of one run of ``agent`` in its thread; the
    run, the seq its events so far end at (read before deciding: what the decisions start comes
    after it), and the decided wait points."""
    from .inputs import approval

    ids = [d.approval_id for d in wanted.decisions]
    waits = {w.approval_id: w for w in WaitPoint.objects.select_related("run").filter(approval_id__in=ids)}
    runs = {w.run_id for w in waits.values()}
    missing = [i for i in ids if i not in waits or not policy().can_view(user, waits[i].run)]
    if missing:
        raise ApiError(404, "not_found", f"no interrupt {missing[0]}")
    run = next(iter(waits.values())).run
    if len(runs) != 1 or run.agent != agent or (run.thread or wanted.thread) != wanted.thread:
        raise ApiError(
            400, "invalid_field", f"the interrupts answered are not all of one run of {agent} in this thread"
        )
    after = event_log().window(run.pk, SEQ_CEILING).top
    decided = []
    for decision in wanted.decisions:
        wait = waits[decision.approval_id]
        if wait.kind == WaitPoint.Kind.INPUT:
            if not decision.resolved:
                raise ApiError(
                    400, "invalid_field", f"{wait.approval_id} is a question: answer it, or cancel the run"
                )
            done = answer(user, wait.approval_id, decision.payload)
        else:
            approve, reason, arguments = approval(decision)
            done = decide(user, wait.approval_id, approve, reason=reason, arguments=arguments)
        decided.append({**decision_json(done), "tool_call_id": done.tool_call_id})
    return run, after, decided


async def _stream(
    run_id: str, after: int, family: Family, viewer: Any, translator: Translator
) -> AsyncIterator[str]:
    from .translate import WAITING

    yield translator.started()
    async for frame in views_stream._events(run_id, after, family, viewer, {}, translator.render):
        if frame != WAITING:
            if frame:
                yield frame
            continue
        waits = await views_stream._briefly(_open_waits, run_id)
        if waits:
            yield translator.interrupted(waits)
            return
        # Decided since it was announced: the run goes on, and so does this AG-UI run.
    if not translator.finished:
        yield translator.lost("the run's events ended before it did (is the run gone?)")


def _open_waits(run_id: str) -> list[dict[str, Any]]:
    rows = WaitPoint.objects.filter(
        run_id=run_id, decision__isnull=True, kind__in=[WaitPoint.Kind.APPROVAL, WaitPoint.Kind.INPUT]
    ).order_by("model_step", "call_position")
    return [waiting_event(w) for w in rows]
