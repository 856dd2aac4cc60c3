"""``@tool``, ``@effect_tool``, ``Agent`` and ``Budget``: pure unit tests, no database."""

import datetime
import json
import uuid
import warnings
from decimal import Decimal
from typing import Annotated, Literal

import pydantic
import pytest
from django.core.exceptions import ImproperlyConfigured

from chamvi_runs import Agent, Budget, effect_tool, tool
from chamvi_runs.agents.agent import RunContext, registry
from chamvi_runs.agents.tools import Tool, to_jsonable
from chamvi_runs.errors import AgentNotFound, ToolArgumentsError

pytestmark = pytest.mark.timeout(30)


class Address(pydantic.BaseModel):
    street: str
    zip_code: str


@tool
def ship(
    order_id: str,
    address: Address,
    quantities: list[int],
    speed: Literal["slow", "fast"] = "slow",
    note: str | None = None,
) -> dict:
    """Ship an order.

    The parcel goes to the given address."""
    return {"order_id": order_id, "street": address.street, "total": sum(quantities), "speed": speed}


@tool
def add(a: int, b: int = 2) -> int:
    """Add two integers."""
    return a + b


@tool
def whoami(ctx, greeting: str) -> str:
    """Greet the run."""
    return f"{greeting} {ctx.run}"


@tool
def count(n: Annotated[int, pydantic.Field(description="How many, at least one", ge=1)]) -> int:
    """Count."""
    return n


@tool
def when(at: datetime.datetime) -> str:
    """Schedule."""
    return at.isoformat()


@effect_tool
def refund(ctx, order_id: str, amount_cents: int) -> dict:
    """Refund an order."""
    return {"key": ctx.idempotency_key, "order_id": order_id, "amount_cents": amount_cents}


# --- schema ---------------------------------------------------------------------------------------


def test_schema_from_type_hints_and_docstring():
    schema = ship.schema()
    assert schema["type"] == "function"
    function = schema["function"]
    assert function["name"] == "ship"
    assert function["description"] == "Ship an order.\n\nThe parcel goes to the given address."
    parameters = function["parameters"]
    assert parameters["type"] == "object"
    assert "title" not in parameters
    assert parameters["required"] == ["order_id", "address", "quantities"]
    assert parameters["additionalProperties"] is False
    properties = parameters["properties"]
    assert list(properties) == ["order_id", "address", "quantities", "speed", "note"]
    assert properties["order_id"]["type"] == "string"
    assert properties["quantities"]["type"] == "array"
    assert properties["quantities"]["items"] == {"type": "integer"}
    assert properties["speed"]["enum"] == ["slow", "fast"]
    assert properties["speed"]["default"] == "slow"
    assert properties["note"]["default"] is None
    # The nested model is described through $defs.
    assert properties["address"] == {"$ref": "#/$defs/Address"}
    address = parameters["$defs"]["Address"]
    assert address["required"] == ["street", "zip_code"]
    assert set(address["properties"]) == {"street", "zip_code"}
    json.dumps(schema)  # sendable as is


def test_schema_keeps_annotated_field_metadata():
    properties = count.schema()["function"]["parameters"]["properties"]
    assert properties["n"]["description"] == "How many, at least one"
    assert properties["n"]["minimum"] == 1
    with pytest.raises(ToolArgumentsError, match="n: Input should be greater than or equal to 1"):
        count.validate('{"n": 0}')


def test_ctx_first_parameter_is_not_described():
    parameters = whoami.schema()["function"]["parameters"]
    assert list(parameters["properties"]) == ["greeting"]
    assert parameters["required"] == ["greeting"]
    assert whoami.takes_ctx is True
    assert add.takes_ctx is False
    seen = []

    @tool
    def capture(ctx, x: int) -> int:
        """Capture ctx."""
        seen.append(ctx)
        return x

    assert capture.invoke("the-ctx", {"x": 5}) == 5
    assert seen == ["the-ctx"]
    assert add.invoke("ignored", {"a": 1, "b": 4}) == 5


def test_a_tool_without_docstring_has_an_empty_description():
    @tool
    def nodoc(x: int) -> int:
        return x

    assert nodoc.schema()["function"]["description"] == ""
    assert nodoc.name == "nodoc"


def test_name_and_description_can_be_given():
    @tool(name="sum_two", description="Sum.")
    def whatever(a: int, b: int) -> int:
        """Ignored."""
        return a + b

    assert isinstance(whatever, Tool)
    assert whatever.name == "sum_two"
    assert whatever.schema()["function"]["description"] == "Sum."

    @effect_tool(name="pay")
    def pay_fn(ctx, amount: int) -> int:
        """Pay."""
        return amount

    assert (pay_fn.name, pay_fn.effect, pay_fn.takes_ctx) == ("pay", True, True)


def test_effect_tool_flags():
    assert refund.effect is True
    assert refund.takes_ctx is True
    assert add.effect is False
    assert refund.schema()["function"]["parameters"]["required"] == ["order_id", "amount_cents"]


def test_effect_tool_without_ctx_is_a_type_error():
    def pay(amount: int) -> int:
        """Pay."""
        return amount

    with pytest.raises(TypeError, match="ctx"):
        effect_tool(pay)


@pytest.mark.parametrize("decorator", [tool, effect_tool])
def test_star_args_and_kwargs_are_type_errors(decorator):
    def star_args(ctx, *numbers: int) -> int:
        return 0

    def star_kwargs(ctx, **options: str) -> int:
        return 0

    with pytest.raises(TypeError, match=r"\*args and \*\*kwargs"):
        decorator(star_args)
    with pytest.raises(TypeError, match=r"\*args and \*\*kwargs"):
        decorator(star_kwargs)


def test_positional_only_parameters_are_type_errors():
    def positional(a: int, /) -> int:
        return a

    with pytest.raises(TypeError, match="positional-only"):
        tool(positional)


def test_tool_names_must_be_valid_for_the_api():
    with pytest.raises(ValueError, match="tool name"):
        tool(lambda x: x)
    with pytest.raises(ValueError, match="tool name"):
        tool(name="has space")(add.fn)


def test_parameter_names_that_clash_with_pydantic_names():
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        @tool
        def query(json: str, schema: str = "public", model_config: int = 0, _trace: bool = False) -> str:
            """Query."""
            return f"{json}/{schema}/{model_config}/{_trace}"

    parameters = query.schema()["function"]["parameters"]
    assert list(parameters["properties"]) == ["json", "schema", "model_config", "_trace"]
    assert parameters["required"] == ["json"]
    arguments = query.validate('{"json": "{}", "model_config": "2", "_trace": true}')
    assert arguments == {"json": "{}", "schema": "public", "model_config": 2, "_trace": True}
    assert query.invoke(None, arguments) == "{}/public/2/True"
    with pytest.raises(ToolArgumentsError, match="json: Field required"):
        query.validate("{}")


# --- validate -------------------------------------------------------------------------------------


def test_validate_returns_typed_values_with_lax_coercion():
    # pydantic's lax mode: a numeric string becomes an int, a float with a fraction does not.
    assert add.validate('{"a": "3", "b": 4}') == {"a": 3, "b": 4}
    assert type(add.validate('{"a": "3"}')["a"]) is int
    assert add.validate('{"a": 1}') == {"a": 1, "b": 2}  # default filled in
    with pytest.raises(ToolArgumentsError, match="a: Input should be a valid integer"):
        add.validate('{"a": 3.5}')
    with pytest.raises(ToolArgumentsError, match="a: Input should be a valid integer"):
        add.validate('{"a": "three"}')


def test_validate_builds_nested_models_and_lists():
    arguments = ship.validate(
        '{"order_id": "A-1", "address": {"street": "Main 1", "zip_code": "1000"}, "quantities": [1, "2"]}'
    )
    assert isinstance(arguments["address"], Address)
    assert arguments["address"].street == "Main 1"
    assert arguments["quantities"] == [1, 2]
    assert arguments["speed"] == "slow"
    assert arguments["note"] is None
    assert ship.invoke(None, arguments) == {
        "order_id": "A-1",
        "street": "Main 1",
        "total": 3,
        "speed": "slow",
    }
    with pytest.raises(ToolArgumentsError, match="speed: Input should be 'slow' or 'fast'"):
        ship.validate(
            '{"order_id": "A-1", "address": {"street": "s", "zip_code": "z"}, "quantities": [], '
            '"speed": "warp"}'
        )
    with pytest.raises(ToolArgumentsError, match=r"address\.zip_code: Field required"):
        ship.validate('{"order_id": "A-1", "address": {"street": "s"}, "quantities": []}')
    with pytest.raises(ToolArgumentsError, match=r"quantities\.1: Input should be a valid integer"):
        ship.validate(
            '{"order_id": "A", "address": {"street": "s", "zip_code": "z"}, "quantities": [1, "x"]}'
        )


def test_validate_parses_datetimes():
    arguments = when.validate('{"at": "2025-03-01T10:00:00Z"}')
    assert arguments["at"] == datetime.datetime(2025, 3, 1, 10, tzinfo=datetime.UTC)


def test_invalid_json_is_a_readable_error():
    with pytest.raises(ToolArgumentsError) as info:
        add.validate('{"a": 1')
    assert str(info.value).startswith("arguments are not valid JSON: ")
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("raw", ["[1, 2]", '"a"', "3", "null"])
def test_arguments_must_be_an_object(raw):
    with pytest.raises(ToolArgumentsError, match="arguments must be a JSON object"):
        add.validate(raw)


def test_missing_argument_names_the_field():
    with pytest.raises(ToolArgumentsError) as info:
        add.validate('{"b": 1}')
    assert str(info.value) == "invalid arguments for add: a: Field required"


def test_empty_arguments_mean_an_empty_object():
    with pytest.raises(ToolArgumentsError, match="a: Field required"):
        add.validate("")

    @tool
    def ping() -> str:
        """Ping."""
        return "pong"

    assert ping.validate("") == {}
    assert ping.validate("{}") == {}


def test_extra_arguments_are_errors():
    with pytest.raises(ToolArgumentsError) as info:
        add.validate('{"a": 1, "c": 2}')
    assert str(info.value) == "invalid arguments for add: c: Extra inputs are not permitted"


# --- to_jsonable ----------------------------------------------------------------------------------


def test_to_jsonable_of_a_model_and_a_datetime():
    assert to_jsonable(Address(street="s", zip_code="z")) == {"street": "s", "zip_code": "z"}
    moment = datetime.datetime(2025, 3, 1, 10, 30, tzinfo=datetime.UTC)
    assert to_jsonable(moment) == "2025-03-01T10:30:00Z"
    assert to_jsonable(datetime.date(2025, 3, 1)) == "2025-03-01"


def test_to_jsonable_of_validated_arguments():
    # Validated arguments hold models and datetimes; what is stored must be JSON data, not repr text.
    arguments = ship.validate(
        '{"order_id": "A-1", "address": {"street": "Main 1", "zip_code": "1000"}, "quantities": [1]}'
    )
    assert to_jsonable(arguments) == {
        "order_id": "A-1",
        "address": {"street": "Main 1", "zip_code": "1000"},
        "quantities": [1],
        "speed": "slow",
        "note": None,
    }
    assert to_jsonable(when.validate('{"at": "2025-03-01T10:00:00Z"}')) == {"at": "2025-03-01T10:00:00Z"}


def test_to_jsonable_of_other_values():
    assert to_jsonable({"n": float("nan"), "inf": float("inf")}) == {"n": None, "inf": None}
    assert to_jsonable((1, 2)) == [1, 2]
    assert sorted(to_jsonable({3, 1})) == [1, 3]
    assert to_jsonable({1: "a"}) == {"1": "a"}
    assert to_jsonable(Decimal("1.50")) == "1.50"
    assert to_jsonable(uuid.UUID(int=1)) == "00000000-0000-0000-0000-000000000001"

    class Opaque:
        def __str__(self) -> str:
            return "opaque!"

    assert to_jsonable({"x": Opaque()}) == {"x": "opaque!"}
    assert to_jsonable(None) is None
    assert to_jsonable("text") == "text"


# --- Agent ----------------------------------------------------------------------------------------


class Verdict(pydantic.BaseModel):
    label: str
    score: float


@pytest.fixture
def name():
    """A unique agent name, unregistered afterwards so other tests are not affected."""
    value = f"unit-{uuid.uuid4().hex[:10]}"
    yield value
    registry.unregister(value)


def _ctx(agent: Agent | None = None, run: object = None) -> RunContext:
    return RunContext(run=run, agent=agent)


def test_constructing_an_agent_registers_it(name):
    agent = Agent(name=name, model="m")
    assert registry.get(name) is agent
    assert name in registry.names()
    registry.unregister(name)
    with pytest.raises(AgentNotFound):
        registry.get(name)


def test_two_agents_with_one_name(name):
    first = Agent(name=name, model="m")
    with pytest.raises(ImproperlyConfigured, match="Two agents are named"):
        Agent(name=name, model="other")
    assert registry.get(name) is first


def test_a_non_tool_in_tools(name):
    def plain(x: int) -> int:
        return x

    with pytest.raises(ImproperlyConfigured, match="is not a @tool, an @effect_tool, an agent or mcp_tools"):
        Agent(name=name, model="m", tools=[add, plain])
    with pytest.raises(AgentNotFound):
        registry.get(name)  # a rejected agent is not registered


def test_two_tools_with_one_name(name):
    other_add = tool(name="add")(lambda a: a)
    with pytest.raises(ImproperlyConfigured, match="two tools are named 'add'"):
        Agent(name=name, model="m", tools=[add, other_add])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model": ""}, "model"),
        ({"instructions": 42}, "instructions"),
        ({"output": int}, "output"),
        ({"on_approval_expired": "ignore"}, "on_approval_expired"),
        ({"budget": {"max_steps": 3}}, "budget"),
        ({"approval_ttl": datetime.timedelta(0)}, "approval_ttl"),
        ({"approval_ttl": "1h"}, "approval_ttl"),
        ({"notifier": "send_mail"}, "notifier"),
        ({"tools": add}, "tools"),
        ({"tools": [add], "approvals": {"ad": True}}, "approvals names 'ad'"),
        ({"tools": [add], "approvals": {"add": "yes"}}, r"approvals\['add'\]"),
    ],
)
def test_wrong_arguments_are_improperly_configured(name, kwargs, match):
    with pytest.raises(ImproperlyConfigured, match=match):
        Agent(**{"name": name, "model": "m", **kwargs})
    with pytest.raises(AgentNotFound):
        registry.get(name)


def test_approval_ttl_in_seconds(name):
    agent = Agent(name=name, model="m", approval_ttl=90)
    assert agent.approval_ttl == datetime.timedelta(seconds=90)


def test_needs_approval_with_bool_and_callable_rules(name):
    calls = []

    def big(arguments, ctx):
        calls.append((arguments, ctx))
        return arguments["amount_cents"] > 1000

    agent = Agent(
        name=name, model="m", tools=[add, refund, ship], approvals={"refund": big, "add": False, "ship": True}
    )
    ctx = _ctx(agent)
    assert agent.needs_approval(refund, {"order_id": "A", "amount_cents": 5000}, ctx) is True
    assert agent.needs_approval(refund, {"order_id": "A", "amount_cents": 10}, ctx) is False
    assert calls[0] == ({"order_id": "A", "amount_cents": 5000}, ctx)
    assert agent.needs_approval(ship, {}, ctx) is True
    assert agent.needs_approval(add, {"a": 1}, ctx) is False
    assert agent.needs_approval(whoami, {}, ctx) is False  # no rule: no approval


def test_approvals_of_a_tool_factory_are_not_checked_against_names(name):
    later = tool(name="later")(lambda: "")
    agent = Agent(name=name, model="m", tools=lambda ctx: [add, later], approvals={"later": True})
    assert agent.needs_approval(later, {}, _ctx(agent)) is True


def test_response_format_for_a_pydantic_model(name):
    agent = Agent(name=name, model="m", output=Verdict)
    assert agent.response_format() == {
        "type": "json_schema",
        "json_schema": {"name": "Verdict", "schema": Verdict.model_json_schema()},
    }


def test_response_format_for_a_dict_schema(name):
    schema = {
        "title": "Refund decision (v2)",
        "type": "object",
        "properties": {"answer": {"type": "string"}},
        "required": ["answer"],
    }
    agent = Agent(name=name, model="m", output=schema)
    response_format = agent.response_format()
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["schema"] == schema
    # The API accepts only ^[a-zA-Z0-9_-]{1,64}$ as a name.
    assert response_format["json_schema"]["name"] == "Refund_decision__v2_"


def test_response_format_name_defaults(name):
    agent = Agent(name=name, model="m", output={"type": "object"})
    assert agent.response_format()["json_schema"]["name"] == "output"
    registry.unregister(name)
    assert Agent(name=name, model="m").response_format() is None


def test_parse_output_with_a_pydantic_model(name):
    agent = Agent(name=name, model="m", output=Verdict)
    assert agent.parse_output('{"label": "spam", "score": "0.5"}') == {"label": "spam", "score": 0.5}
    with pytest.raises(ValueError, match="output does not match Verdict: score: Field required"):
        agent.parse_output('{"label": "spam"}')
    with pytest.raises(ValueError, match="Verdict"):
        agent.parse_output("not json")


def test_parse_output_with_a_dict_schema(name):
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    agent = Agent(name=name, model="m", output=schema)
    assert agent.parse_output('{"answer": "42", "extra": 1}') == {"answer": "42", "extra": 1}
    with pytest.raises(ValueError, match="output misses required keys: answer"):
        agent.parse_output('{"other": 1}')
    with pytest.raises(ValueError, match="output is not JSON"):
        agent.parse_output("the answer is 42")
    with pytest.raises(ValueError, match="output must be a JSON object"):
        agent.parse_output('["answer"]')


def test_parse_output_checks_the_top_level_type(name):
    agent = Agent(name=name, model="m", output={"type": "array", "items": {"type": "string"}})
    assert agent.parse_output('["a"]') == ["a"]
    with pytest.raises(ValueError, match="output must be a JSON array"):
        agent.parse_output('{"a": 1}')


def test_parse_output_without_output_is_the_text(name):
    agent = Agent(name=name, model="m")
    assert agent.parse_output("plain {text}") == "plain {text}"


def test_instructions_as_str_and_callable(name):
    agent = Agent(name=name, model="m", instructions="Be brief.")
    assert agent.render_instructions(_ctx(agent)) == "Be brief."
    registry.unregister(name)
    agent = Agent(name=name, model="m", instructions=lambda ctx: f"Serve {ctx.run}.")
    assert agent.render_instructions(_ctx(agent, run="run-7")) == "Serve run-7."


def test_tools_as_a_list_and_as_a_factory(name):
    agent = Agent(name=name, model="m", tools=[add, whoami])
    assert agent.assemble_tools(_ctx(agent)) == {"add": add, "whoami": whoami}
    registry.unregister(name)

    def factory(ctx):
        return [add] if ctx.run == "math" else [whoami, refund]

    agent = Agent(name=name, model="m", tools=factory)
    assert agent.assemble_tools(_ctx(agent, run="math")) == {"add": add}
    assert agent.assemble_tools(_ctx(agent, run="other")) == {"whoami": whoami, "refund": refund}


def test_tools_from_a_generator_are_kept(name):
    agent = Agent(name=name, model="m", tools=(t for t in [add, ship]))
    assert list(agent.assemble_tools(_ctx(agent))) == ["add", "ship"]
    assert list(agent.assemble_tools(_ctx(agent))) == ["add", "ship"]


def test_agent_default_budget(name):
    agent = Agent(name=name, model="m")
    assert agent.budget == Budget(max_steps=20, max_tokens=None, timeout_ms=None)


# --- Budget ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["max_steps", "max_tokens", "timeout_ms"])
@pytest.mark.parametrize("value", [0, -1, True, False, 1.5, "10"])
def test_budget_rejects(field, value):
    with pytest.raises(ValueError, match=f"Budget.{field} must be a positive int or None"):
        Budget(**{field: value})


@pytest.mark.parametrize("field", ["max_steps", "max_tokens", "timeout_ms"])
def test_budget_accepts_positive_ints_and_none(field):
    assert getattr(Budget(**{field: 1}), field) == 1
    assert getattr(Budget(**{field: None}), field) is None
