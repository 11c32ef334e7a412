"""Declarations made from signatures and docstrings (no server needed)."""

from __future__ import annotations

import enum
from typing import Annotated, Any, Dict, List, Literal, Optional, Sequence, Set, Tuple, TypedDict, Union

import pytest

from sandcall import Tool, schema_for_type, tool


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(TypedDict):
    x: float
    y: float


@pytest.mark.parametrize(
    "hint, schema",
    [
        (str, {"type": "string"}),
        (int, {"type": "integer"}),
        (float, {"type": "number"}),
        (bool, {"type": "boolean"}),
        (type(None), {"type": "null"}),
        (Any, {}),
        (List[int], {"type": "array", "items": {"type": "integer"}}),
        (list, {"type": "array"}),
        (Sequence[str], {"type": "array", "items": {"type": "string"}}),
        (Set[str], {"type": "array", "items": {"type": "string"}, "uniqueItems": True}),
        (Tuple[int, ...], {"type": "array", "items": {"type": "integer"}}),
        (
            Tuple[int, str],
            {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "minItems": 2, "maxItems": 2},
        ),
        (Dict[str, float], {"type": "object", "additionalProperties": {"type": "number"}}),
        (dict, {"type": "object"}),
        (Optional[int], {"anyOf": [{"type": "integer"}, {"type": "null"}]}),
        (Union[int, str], {"anyOf": [{"type": "integer"}, {"type": "string"}]}),
        (Literal["a", "b"], {"enum": ["a", "b"], "type": "string"}),
        (Color, {"enum": ["red", "blue"], "type": "string"}),
        (Annotated[int, "how many"], {"type": "integer", "description": "how many"}),
        (
            Point,
            {
                "type": "object",
                "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                "required": ["x", "y"],
            },
        ),
    ],
)
def test_type_hints_become_json_schema(hint: Any, schema: Dict[str, Any]) -> None:
    assert schema_for_type(hint) == schema


def test_a_google_docstring_describes_the_tool_and_its_parameters() -> None:
    def search(query: str, limit: int = 10, *, lang: Optional[str] = None) -> List[str]:
        """Searches the web.

        Returns the best pages first.

        Args:
            query (str): What to look for,
                in plain words.
            limit: How many results.
            lang: A language code.

        Returns:
            The URLs.
        """
        return []

    assert Tool.from_function(search).declaration() == {
        "name": "search",
        "description": "Searches the web.\n\nReturns the best pages first.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for, in plain words."},
                "limit": {"type": "integer", "description": "How many results.", "default": 10},
                "lang": {"anyOf": [{"type": "string"}, {"type": "null"}], "description": "A language code."},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    }


def test_sphinx_and_numpy_docstrings() -> None:
    def sphinx(a: int, b: str) -> None:
        """Sphinx style.

        :param a: the a
        :param str b: the b,
            continued
        :returns: nothing
        """

    def numpy(a: int, b: str) -> None:
        """NumPy style.

        Parameters
        ----------
        a : int
            the a
        b : str
            the b
        """

    for fn, summary in ((sphinx, "Sphinx style."), (numpy, "NumPy style.")):
        decl = Tool.from_function(fn).declaration()
        assert decl["description"] == summary
        props = decl["parameters"]["properties"]
        assert props["a"]["description"] == "the a"
        assert props["b"]["description"].startswith("the b")


def test_kwargs_allow_more_properties_and_names_can_be_given() -> None:
    @tool(name="get-rate", description="A rate")
    def rate(base: str, **rest: Any) -> float:
        return 1.0

    decl = rate.declaration()
    assert decl["name"] == "get-rate" and decl["description"] == "A rate"
    assert "additionalProperties" not in decl["parameters"]
    assert decl["parameters"]["required"] == ["base"]


def test_hints_that_do_not_evaluate_take_any_value() -> None:
    def f(x: "NoSuchType", y: int) -> None:  # noqa: F821
        pass

    props = Tool.from_function(f).declaration()["parameters"]["properties"]
    assert props == {"x": {}, "y": {"type": "integer"}}


def test_a_lambda_needs_a_name() -> None:
    with pytest.raises(ValueError, match="no usable name"):
        Tool.from_function(lambda: 1)
    assert Tool.from_function(lambda: 1, name="one").name == "one"
