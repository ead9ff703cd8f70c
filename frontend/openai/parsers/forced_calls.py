"""The output form of ``tool_choice`` "required" and a named function, as vLLM defines it: the JSON schema
structured outputs constrain the output to, and the parse of an output of that form.

vLLM forces these calls by constraining the output to JSON: a named function's output is its arguments
object; "required" writes a non-empty array of ``{"name": ..., "parameters": {...}}`` objects (at most one
when ``parallel_tool_calls`` is false).
"""

from __future__ import annotations

import copy
from typing import Any

from openinfer.frontend.openai.parsers.tool_call import ToolCall, load_json

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}  # a function without parameters


def named_call_schema(parameters: dict[str, Any] | None) -> dict[str, Any]:
    """The schema of a named function's output: its parameters (an object, whatever they say)."""
    return copy.deepcopy(parameters) if parameters else dict(EMPTY_PARAMETERS)


def required_calls_schema(functions: dict[str, dict[str, Any] | None], parallel: bool) -> dict[str, Any]:
    """The schema of "required": an array of calls, each one of ``functions`` (name -> parameters).

    Each function's ``$defs`` move to the array's, where its ``$ref`` s find them; two functions defining
    one name differently raise ``ValueError``.
    """
    defs: dict[str, Any] = {}
    choices = []
    for name, parameters in functions.items():
        schema = named_call_schema(parameters)
        for def_name, definition in schema.pop("$defs", {}).items():
            if defs.setdefault(def_name, definition) != definition:
                raise ValueError(f"two tools define `$defs.{def_name}` differently")
        choices.append(
            {
                "properties": {"name": {"type": "string", "enum": [name]}, "parameters": schema},
                "required": ["name", "parameters"],
            }
        )
    array: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": choices}}
    if not parallel:
        array["maxItems"] = 1
    if defs:
        array["$defs"] = defs
    return array


def parse_named_call(text: str, name: str) -> list[ToolCall] | None:
    """The call a named function's output makes: the output is its arguments object; else None."""
    arguments = load_json(text)
    return [ToolCall.of(name, arguments)] if isinstance(arguments, dict) else None


def parse_required_calls(text: str) -> list[ToolCall] | None:
    """The calls a "required" output makes: a non-empty array of ``{"name", "parameters"}``; else None."""
    value = load_json(text)
    if not isinstance(value, list) or not value:
        return None
    calls = []
    for entry in value:
        if not isinstance(entry, dict):
            return None
        name, parameters = entry.get("name"), entry.get("parameters")
        if not isinstance(name, str) or not name or not isinstance(parameters, dict):
            return None
        calls.append(ToolCall.of(name, parameters))
    return calls
