"""Tools: a callable and the declaration the server gets for it.

A declaration comes from the callable's signature and docstring (type hints become a JSON
Schema, the docstring the description), or from a definition written for another API,
taken as it is: OpenAI's ``{"type": "function", "function": {...}}``, the bare
``{"name", "parameters"}`` form (also OpenAI's flat Responses form), or Anthropic's
``{"name", "input_schema"}``.
"""

from __future__ import annotations

import collections.abc as _abc
import dataclasses
import enum
import inspect
import re
import typing
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import sys
from typing import Annotated, Literal, get_args, get_origin

if sys.version_info >= (3, 10):
    from types import UnionType
    from typing import is_typeddict as _is_typeddict

    _UNION_TYPES: Tuple[type, ...] = (UnionType,)  # `int | None`
else:  # pragma: no cover - Python 3.9
    _UNION_TYPES = ()

    def _is_typeddict(tp: Any) -> bool:
        return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__total__")


JSONSchema = Dict[str, Any]


class Tool:
    """A tool the program may call: its declared ``name``, ``description`` and
    ``parameters`` (a JSON Schema of the arguments object), and the callable that answers
    it. The callable gets the arguments as keyword arguments, may be plain or ``async``,
    and returns any JSON value; an exception it raises reaches the program as a tool
    error with the exception's message."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str,
        description: Optional[str] = None,
        parameters: Optional[JSONSchema] = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"tool {name!r}: {fn!r} is not callable")
        if not isinstance(name, str) or not name:
            raise ValueError("a tool needs a non-empty name")
        if parameters is not None and not isinstance(parameters, dict):
            raise TypeError(f"tool {name!r}: parameters must be a JSON Schema object (a dict)")
        self.fn = fn
        self.name = name
        self.description = description
        self.parameters = parameters

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        *,
        name: Optional[str] = None,
        description: Optional[str] = None,
    ) -> "Tool":
        """Declares ``fn`` from its signature and docstring."""
        summary, param_docs = _parse_docstring(inspect.getdoc(fn) or "")
        tool_name = name or getattr(fn, "__name__", None)
        if not tool_name or tool_name == "<lambda>":
            raise ValueError(f"{fn!r} has no usable name: give the tool one")
        return cls(
            fn,
            name=tool_name,
            description=description if description is not None else (summary or None),
            parameters=schema_from_signature(fn, param_docs),
        )

    @classmethod
    def from_definition(cls, definition: Mapping[str, Any], fn: Callable[..., Any]) -> "Tool":
        """Declares ``fn`` with a definition written for OpenAI or Anthropic, as it is."""
        name, description, parameters = parse_definition(definition)
        return cls(fn, name=name, description=description, parameters=parameters)

    def declaration(self) -> Dict[str, Any]:
        """The tool as the API declares it: ``{"name", "description", "parameters"}``."""
        decl: Dict[str, Any] = {"name": self.name}
        if self.description is not None:
            decl["description"] = self.description
        if self.parameters is not None:
            decl["parameters"] = self.parameters
        return decl

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tool(name={self.name!r}, fn={self.fn!r})"


def tool(
    fn: Any = None,
    handler: Optional[Callable[..., Any]] = None,
    *,
    name: Optional[str] = None,
    description: Optional[str] = None,
) -> Any:
    """Makes a :class:`Tool`.

    - ``@tool`` or ``@tool(name=..., description=...)`` on a function declares it from
      its signature and docstring.
    - ``tool(definition, handler)`` pairs an OpenAI or Anthropic tool definition with the
      callable that answers it.
    """
    if isinstance(fn, Mapping):
        if handler is None:
            raise TypeError("tool(definition, handler): the handler is missing")
        made = Tool.from_definition(fn, handler)
        if name is not None:
            made.name = name
        if description is not None:
            made.description = description
        return made
    if fn is None:
        return lambda f: Tool.from_function(f, name=name, description=description)
    return Tool.from_function(fn, name=name, description=description)


ToolSpec = Union[Callable[..., Any], Tool, Tuple[Mapping[str, Any], Callable[..., Any]]]
ToolsArg = Union[Mapping[str, ToolSpec], Sequence[ToolSpec], None]


def normalize_tools(tools: ToolsArg) -> Dict[str, Tool]:
    """Reads the ``tools`` argument of ``run``: a mapping of name to callable, ``Tool``
    or ``(definition, callable)``, or a list of those (named by the function, the Tool or
    the definition)."""
    if tools is None:
        return {}
    out: Dict[str, Tool] = {}
    if isinstance(tools, Mapping):
        items: List[Tuple[Optional[str], Any]] = list(tools.items())
    elif isinstance(tools, (list, tuple)):
        items = [(None, spec) for spec in tools]
    else:
        raise TypeError("tools must be a dict of name -> callable, or a list of tools")
    for key, spec in items:
        made = _make_tool(key, spec)
        if made.name in out:
            raise ValueError(f"two tools are named {made.name!r}")
        out[made.name] = made
    return out


def _make_tool(key: Optional[str], spec: Any) -> Tool:
    if key is not None and not isinstance(key, str):
        raise TypeError(f"tool names must be strings, not {key!r}")
    if isinstance(spec, Tool):
        made = spec
    elif isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], Mapping):
        made = Tool.from_definition(spec[0], spec[1])
    elif isinstance(spec, Mapping):
        raise TypeError(
            f"tool {key or spec.get('name')!r}: a definition needs the callable that answers it: "
            "pass (definition, callable) or tool(definition, callable)"
        )
    elif callable(spec):
        return Tool.from_function(spec, name=key)
    else:
        raise TypeError(f"tool {key!r}: {spec!r} is neither a callable nor a Tool")
    if key is not None and key != made.name:
        # A definition's name is what the program calls; a second name would be a guess.
        raise ValueError(f"tool {key!r} is given a definition named {made.name!r}: use one name")
    return made


def parse_definition(definition: Mapping[str, Any]) -> Tuple[str, Optional[str], Optional[JSONSchema]]:
    """(name, description, parameters) of an OpenAI, Anthropic or bare definition."""
    if not isinstance(definition, Mapping):
        raise TypeError("a tool definition must be a dict")
    body: Mapping[str, Any] = definition
    if definition.get("type") == "function" and isinstance(definition.get("function"), Mapping):
        body = definition["function"]  # OpenAI Chat Completions
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"the tool definition {dict(definition)!r} has no name")
    description = body.get("description")
    if description is not None and not isinstance(description, str):
        raise TypeError(f"tool {name!r}: description must be a string")
    if "input_schema" in body and "parameters" in body:
        raise ValueError(f"tool {name!r}: give either parameters (OpenAI) or input_schema (Anthropic), not both")
    parameters = body.get("parameters", body.get("input_schema"))
    if parameters is not None and not isinstance(parameters, Mapping):
        raise TypeError(f"tool {name!r}: its schema must be a JSON Schema object (a dict)")
    return name, description, dict(parameters) if parameters is not None else None


# --- Schemas from type hints ---------------------------------------------------------


def schema_from_signature(fn: Callable[..., Any], param_docs: Optional[Dict[str, str]] = None) -> JSONSchema:
    """The JSON Schema of the arguments object of ``fn``: one property per parameter,
    typed from its hint, required unless it has a default."""
    param_docs = param_docs or {}
    signature = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:
        hints = _hints_one_by_one(fn, signature)
    properties: Dict[str, JSONSchema] = {}
    required: List[str] = []
    extra = False
    for param in signature.parameters.values():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            extra = True
            continue
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise TypeError(
                f"{getattr(fn, '__name__', fn)}: parameter {param.name!r} is positional-only, "
                "but tools are called with keyword arguments"
            )
        schema = schema_for_type(hints.get(param.name, Any))
        if param.name in param_docs and "description" not in schema:
            schema["description"] = param_docs[param.name]
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
        elif param.default is not None and _is_json(param.default):
            schema["default"] = param.default
        properties[param.name] = schema
    schema_out: JSONSchema = {"type": "object", "properties": properties}
    if required:
        schema_out["required"] = required
    if not extra:
        # The callable takes no other keyword: the server refuses such a call before it
        # reaches us, and the program learns why.
        schema_out["additionalProperties"] = False
    return schema_out


def _hints_one_by_one(fn: Callable[..., Any], signature: inspect.Signature) -> Dict[str, Any]:
    """The hints that evaluate, when some do not (a name only a type checker sees, or
    `X | Y` on Python 3.9): those parameters take any value."""
    namespace = dict(getattr(fn, "__globals__", {}))
    hints: Dict[str, Any] = {}
    for param in signature.parameters.values():
        annotation = param.annotation
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, namespace)  # noqa: S307 - the caller's own annotation
            except Exception:
                continue
        hints[param.name] = annotation
    return hints


def schema_for_type(tp: Any) -> JSONSchema:
    """The JSON Schema of one type hint; ``{}`` (any value) for what has no JSON form."""
    schema: JSONSchema
    if tp is Any or tp is inspect.Parameter.empty or tp is object:
        return {}
    if tp is None or tp is type(None):
        return {"type": "null"}
    origin = get_origin(tp)
    args = get_args(tp)
    if origin is Annotated:
        schema = schema_for_type(args[0])
        notes = [a for a in args[1:] if isinstance(a, str)]
        if notes:
            schema["description"] = " ".join(notes)
        return schema
    if origin is Union or isinstance(tp, _UNION_TYPES):
        options = [schema_for_type(a) for a in args]
        if any(o == {} for o in options):
            return {}
        return {"anyOf": options}
    if origin is Literal:
        values = list(args)
        schema = {"enum": values}
        kinds = {_json_type(v) for v in values}
        if len(kinds) == 1 and None not in kinds:
            schema["type"] = kinds.pop()
        return schema
    if isinstance(tp, type):
        if issubclass(tp, enum.Enum):
            values = [m.value for m in tp]
            schema = {"enum": values}
            kinds = {_json_type(v) for v in values}
            if len(kinds) == 1 and None not in kinds:
                schema["type"] = kinds.pop()
            return schema
        if issubclass(tp, bool):
            return {"type": "boolean"}
        if issubclass(tp, int):
            return {"type": "integer"}
        if issubclass(tp, float):
            return {"type": "number"}
        if issubclass(tp, str):
            return {"type": "string"}
        if _is_typeddict(tp):
            return _typeddict_schema(tp)
        if dataclasses.is_dataclass(tp):
            return {"type": "object"}
    container = origin if origin is not None else tp
    if container in (list, set, frozenset) or container in _ABC_SEQUENCES:
        schema = {"type": "array"}
        if args:
            items = schema_for_type(args[0])
            if items:
                schema["items"] = items
        if container in (set, frozenset) or container is _abc.Set:
            schema["uniqueItems"] = True
        return schema
    if container is tuple:
        if not args or (len(args) == 2 and args[1] is Ellipsis):
            schema = {"type": "array"}
            if args and schema_for_type(args[0]):
                schema["items"] = schema_for_type(args[0])
            return schema
        return {
            "type": "array",
            "prefixItems": [schema_for_type(a) for a in args],
            "minItems": len(args),
            "maxItems": len(args),
        }
    if container is dict or container in _ABC_MAPPINGS:
        schema = {"type": "object"}
        if len(args) == 2:
            value_schema = schema_for_type(args[1])
            if value_schema:
                schema["additionalProperties"] = value_schema
        return schema
    return {}


_ABC_SEQUENCES = (_abc.Sequence, _abc.MutableSequence, _abc.Iterable, _abc.Collection, _abc.Set, _abc.MutableSet)
_ABC_MAPPINGS = (_abc.Mapping, _abc.MutableMapping)


def _typeddict_schema(tp: Any) -> JSONSchema:
    try:
        hints = typing.get_type_hints(tp, include_extras=True)
    except Exception:
        hints = {}
    required = sorted(getattr(tp, "__required_keys__", hints.keys()))
    schema: JSONSchema = {
        "type": "object",
        "properties": {k: schema_for_type(v) for k, v in hints.items()},
    }
    if required:
        schema["required"] = [k for k in hints if k in required]
    return schema


def _json_type(value: Any) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "other"


def _is_json(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return False


# --- Docstrings ----------------------------------------------------------------------

_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Returns?|Yields?|Raises|"
    r"Examples?|Notes?|See Also|Attributes)\s*:?\s*$"
)
_GOOGLE_PARAM = re.compile(r"^(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_PARAM = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")
_NUMPY_PARAM = re.compile(r"^(\w+)\s*(?::\s*.*)?$")


def _parse_docstring(doc: str) -> Tuple[str, Dict[str, str]]:
    """(description, {parameter: description}) of a Google, Sphinx or NumPy docstring.
    The description is the text before the first section, joined into paragraphs."""
    lines = doc.splitlines()
    summary: List[str] = []
    params: Dict[str, str] = {}
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if _SECTION.match(stripped) or stripped.startswith(":"):
            break
        summary.append(stripped)
        i += 1
    section: Optional[str] = None
    numpy_style = False
    current: Optional[str] = None
    indent: Optional[int] = None
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        i += 1
        if not stripped:
            current = None
            continue
        if set(stripped) == {"-"}:  # NumPy's underline of a section header
            numpy_style = True
            continue
        header = _SECTION.match(stripped)
        if header and (line[: len(line) - len(line.lstrip())] == "" or stripped.endswith(":")):
            section = header.group(1).lower()
            current, indent = None, None
            continue
        sphinx = _SPHINX_PARAM.match(stripped)
        if sphinx:
            section = "sphinx"
            current = sphinx.group(1)
            params[current] = sphinx.group(2).strip()
            continue
        if section in ("args", "arguments", "parameters", "params", "keyword args", "keyword arguments"):
            level = len(line) - len(line.lstrip())
            if indent is None:
                indent = level
            if level <= indent:
                if numpy_style:  # `name : type`, its description indented below
                    numpy = _NUMPY_PARAM.match(stripped)
                    if numpy:
                        current = numpy.group(1)
                        params[current] = ""
                        continue
                else:  # `name (type): description`
                    google = _GOOGLE_PARAM.match(stripped)
                    if google:
                        current = google.group(1).lstrip("*")
                        params[current] = google.group(3).strip()
                        continue
            if current is not None:
                params[current] = (params[current] + " " + stripped).strip()
        elif section == "sphinx" and current is not None:
            params[current] = (params[current] + " " + stripped).strip()
    text = "\n".join(summary).strip()
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]
    return "\n\n".join(paragraphs), {k: v for k, v in params.items() if v}
