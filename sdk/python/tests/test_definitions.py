"""Tools declared with definitions written for OpenAI or Anthropic, taken as they are: the
server gets their schema (it refuses calls that break it) and the paired callable answers."""

from __future__ import annotations

from typing import Any, Dict, List

import pytest

from sandcall import Sandcall, tool

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["C", "F"]},
    },
    "required": ["city"],
    "additionalProperties": False,
}

# The same program for every form: one good call, and one that breaks the schema (a unit
# outside the enum), which the server refuses before it reaches the caller.
PROGRAM = "\n".join(
    [
        "print(weather(city='Oslo', unit='C'))",
        "try:",
        "    weather(city='Oslo', unit='K')",
        "except ToolError as e:",
        "    print('refused')",
    ]
)


def _weather(calls: List[Dict[str, Any]]):
    def weather(**arguments: Any) -> str:
        calls.append(arguments)
        return f"{arguments['city']}: 3 {arguments.get('unit', 'C')}"

    return weather


@pytest.mark.parametrize(
    "definition",
    [
        pytest.param(
            {
                "type": "function",
                "function": {"name": "weather", "description": "Weather now", "parameters": WEATHER_SCHEMA},
            },
            id="openai-chat",
        ),
        pytest.param({"name": "weather", "description": "Weather now", "parameters": WEATHER_SCHEMA}, id="bare"),
        pytest.param(
            {"type": "function", "name": "weather", "description": "Weather now", "parameters": WEATHER_SCHEMA},
            id="openai-responses",
        ),
        pytest.param({"name": "weather", "description": "Weather now", "input_schema": WEATHER_SCHEMA}, id="anthropic"),
    ],
)
def test_a_definition_is_declared_as_it_is(client: Sandcall, definition: Dict[str, Any]) -> None:
    calls: List[Dict[str, Any]] = []
    for tools in ({"weather": (definition, _weather(calls))}, [tool(definition, _weather(calls))]):
        result = client.run(PROGRAM, tools=tools)
        assert result.stdout == "Oslo: 3 C\nrefused\n", result
        assert [c.arguments for c in result.tool_calls] == [{"city": "Oslo", "unit": "C"}]
    assert calls == [{"city": "Oslo", "unit": "C"}] * 2


def test_definitions_and_functions_mix_in_one_run(client: Sandcall) -> None:
    anthropic = {
        "name": "lookup-user",
        "description": "A user by id",
        "input_schema": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
    }

    def double(n: int) -> int:
        return 2 * n

    result = client.run(
        "u = lookup_user(id=7)\nprint(u['name'], double(n=u['id']))",
        tools={"lookup-user": (anthropic, lambda id: {"id": id, "name": "ada"}), "double": double},
    )
    assert result.stdout == "ada 14\n", result
    assert [c.name for c in result.tool_calls] == ["lookup-user", "double"]


def test_a_definition_under_another_name_is_refused_before_any_request() -> None:
    from sandcall._tools import normalize_tools

    with pytest.raises(ValueError, match="use one name"):
        normalize_tools({"other": ({"name": "weather", "parameters": {}}, print)})
    with pytest.raises(TypeError, match="needs the callable"):
        normalize_tools({"weather": {"name": "weather"}})
    with pytest.raises(ValueError, match="has no name"):
        normalize_tools([({"parameters": {}}, print)])
    with pytest.raises(ValueError, match="two tools"):
        normalize_tools([({"name": "a"}, print), ({"name": "a"}, print)])
