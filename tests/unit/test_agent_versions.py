"""An agent's version (SPEC §14): explicit, or derived from what its runs depend on."""

from __future__ import annotations

from collections.abc import Iterator

import pydantic
import pytest
from django.core.exceptions import ImproperlyConfigured

from chamvi_runs import Agent, tool
from chamvi_runs.agents.agent import registry


@tool
def lookup(order_id: str) -> dict:
    """Look up an order."""
    return {}


@tool(name="lookup")
def lookup_by_email(email: str) -> dict:
    """Look up an order."""
    return {}


class Verdict(pydantic.BaseModel):
    ok: bool


@pytest.fixture
def agents() -> Iterator[list[str]]:
    """Names of the agents a test made, unregistered after it."""
    made: list[str] = []
    yield made
    for name in made:
        registry.unregister(name)


def _agent(agents: list[str], name: str, **kwargs) -> Agent:
    agents.append(name)
    return Agent(name=name, **{"model": "m", "instructions": "Help.", "tools": [lookup], **kwargs})


def test_the_same_definition_has_the_same_version_and_any_change_another(agents):
    base = _agent(agents, "v_base")
    assert len(base.version) == 12 and int(base.version, 16) >= 0
    assert _agent(agents, "v_same").version == base.version
    changed = {
        "instructions": _agent(agents, "v_instructions", instructions="Help more.").version,
        "model": _agent(agents, "v_model", model="m2").version,
        "output": _agent(agents, "v_output", output=Verdict).version,
        "tool arguments": _agent(agents, "v_tool", tools=[lookup_by_email]).version,
        "no tools": _agent(agents, "v_none", tools=[]).version,
    }
    assert base.version not in changed.values()
    assert len(set(changed.values())) == len(changed), changed


def test_an_explicit_version_wins_and_a_bad_one_is_refused(agents):
    assert _agent(agents, "v_tagged", version="release-42").version == "release-42"
    for bad in ("", "x" * 65, 42):
        with pytest.raises(ImproperlyConfigured, match="version"):
            _agent(agents, f"v_bad_{len(agents)}", version=bad)


def test_callables_are_hashed_by_their_names_not_their_bodies(agents):
    def instructions(ctx) -> str:
        return "Help."

    def tools(ctx) -> list:
        return [lookup]

    first = _agent(agents, "v_callables", instructions=instructions, tools=tools)
    second = _agent(agents, "v_callables_again", instructions=instructions, tools=tools)
    assert first.version == second.version
    assert first.version != _agent(agents, "v_plain").version


def test_a_callable_object_is_hashed_by_its_class_never_by_its_address(agents):
    class Instructions:
        def __call__(self, ctx) -> str:
            return "Help."

    # Two instances: two addresses, as two processes would have.
    versions = [_agent(agents, f"v_instance_{n}", instructions=Instructions()).version for n in range(2)]
    assert versions[0] == versions[1]
