"""``human_tool``: a tool the model calls to ask the run's user something (SPEC §12). Calling it
opens a wait point of kind ``input`` instead of running code; the answer becomes its result."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pydantic

from .tools import Question, Tool, check_tool_name


class _Ask(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    question: str = pydantic.Field(description="The question, as the user will read it.")


class _ClientAsk(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    question: str = pydantic.Field("", description="What the page is asked, if anything.")


def _never_called(**_: Any) -> Any:
    raise AssertionError("a question is answered by a person or a page, never run")


def human_tool(
    name: str,
    description: str = "",
    *,
    answer_schema: Any = None,
    ttl: timedelta | float | None = None,
    client: bool = False,
) -> Tool:
    """A tool the model calls to ask the run's user (``{"question": ...}``); the run waits, without
    holding a worker, until ``answer`` is given, and the answer is the tool's result.

    ``answer_schema``: a type pydantic validates (``str``, ``bool``, ``Literal[...]``, a model, a
    TypedDict); None takes any JSON value. ``ttl``: how long the question waits (the agent's
    ``approval_ttl`` or ``APPROVAL_TTL`` by default); when it expires the model is told that no
    answer came. ``client``: the page's code answers (a client tool), not a person."""
    check_tool_name(name)
    if isinstance(ttl, int | float) and not isinstance(ttl, bool):
        ttl = timedelta(seconds=ttl)
    if ttl is not None and not (isinstance(ttl, timedelta) and ttl > timedelta(0)):
        raise ValueError(f"human_tool {name}: ttl must be a positive timedelta or number of seconds")
    question = Question(answer_schema, ttl, bool(client))
    try:
        question.answer_schema  # noqa: B018 - a type pydantic cannot describe fails here, not mid-run
    except pydantic.PydanticUserError as exc:
        raise TypeError(
            f"human_tool {name}: answer_schema is not a type pydantic can validate: {exc}"
        ) from None
    return Tool(
        name=name,
        description=description or ("Ask the user's page for something." if client else "Ask the user."),
        fn=_never_called,
        args_model=_ClientAsk if client else _Ask,
        takes_ctx=False,
        question=question,
    )
