"""A chat request's ``tools``, ``tool_choice`` and ``parallel_tool_calls``, validated as OpenAI validates
them, and allowed as vLLM allows them (tool_choice "auto" needs ``--enable-auto-tool-choice``, "required"
and a named function need ``--tool-call-parser``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from openinfer.frontend.openai.errors import ApiError, invalid_request, missing_parameter
from openinfer.frontend.openai.parsers.chat_parsers import ChatParsers
from openinfer.frontend.openai.parsers.forced_calls import (
    named_call_schema,
    parse_named_call,
    parse_required_calls,
    required_calls_schema,
)
from openinfer.frontend.openai.parsers.tool_call import ToolCall

FUNCTION_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for function names
_NAMED = 'a named function is {"type": "function", "function": {"name": "..."}}'


@dataclass(frozen=True)
class NamedToolChoice:
    """``tool_choice: {"type": "function", "function": {"name": ...}}``: that function must be called."""

    name: str


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


@dataclass(frozen=True)
class ChatTools:
    """The tools a request offers the model and how it may call them."""

    tools: list[dict[str, Any]] | None  # as the client sent them (the chat template renders them); None: none
    choice: ToolChoice  # default "auto" with tools, "none" without
    parallel_tool_calls: bool  # false: at most one call (vLLM keeps the first)

    @property
    def parses_calls(self) -> bool:
        """Whether the output is read for tool calls (tool_choice "none" leaves it as written)."""
        return self.tools is not None and self.choice != "none"

    def output_schema(self) -> dict[str, Any] | None:
        """The JSON schema the output must satisfy for the call to be certain: a named function's
        arguments, or the array of calls of "required" (vLLM's forms); None for "auto" and "none".

        The chat request makes it the engine request's JSON constraint (structured outputs, xgrammar), so
        the model writes an output of this form and :meth:`forced_calls` reads the calls back.
        """
        functions = {
            tool["function"]["name"]: tool["function"].get("parameters") for tool in self.tools or []
        }
        if isinstance(self.choice, NamedToolChoice):
            return named_call_schema(functions[self.choice.name])
        if self.choice == "required":
            return required_calls_schema(functions, self.parallel_tool_calls)
        return None

    def forced_calls(self, output: str) -> list[ToolCall] | None:
        """The calls an output of :meth:`output_schema`'s form makes; None when it has another form (or
        the choice forces nothing), so that it is read as "auto" reads it."""
        if isinstance(self.choice, NamedToolChoice):
            return parse_named_call(output, self.choice.name)
        if self.choice == "required":
            return parse_required_calls(output)
        return None


def parse_chat_tools(tools: object, tool_choice: object, parallel: object, parsers: ChatParsers) -> ChatTools:
    """The body's tool fields; 400 naming the bad field (``tools[0].function.name``, ...) otherwise."""
    offered = parse_tools(tools)
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid_request("`parallel_tool_calls` must be true or false", param="parallel_tool_calls")
    names = [tool["function"]["name"] for tool in offered or []]
    choice = _choice(tool_choice, names)
    if offered is None and choice != "none":
        raise invalid_request(
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
            param="tool_choice",
        )
    if offered is not None and tool_choice is None:
        choice = "auto"  # OpenAI's and vLLM's default when tools are given
    _check_allowed(choice, parsers)
    chat_tools = ChatTools(offered, choice, parallel is not False)
    try:
        chat_tools.output_schema()
    except ValueError as e:
        raise invalid_request(str(e), param="tools") from None
    return chat_tools


def parse_tools(value: object) -> list[dict[str, Any]] | None:
    """A body's ``tools`` (OpenAI's function tools, as sent), or None; 400 naming the bad part."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise invalid_request("`tools` must be a list of tools", param="tools")
    if not value:
        raise invalid_request(
            "Invalid 'tools': empty array. Expected an array with minimum length 1, but got an empty array "
            "instead. Provide at least one tool or leave `tools` out.",
            param="tools",
        )
    for i, tool in enumerate(value):
        _check_tool(tool, f"tools[{i}]")
    return value


def _check_tool(tool: object, path: str) -> None:
    """``{"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}``."""
    if not isinstance(tool, dict):
        raise invalid_request(f"`{path}` must be an object", param=path)
    kind = tool.get("type", "function")  # vLLM's default
    if kind != "function":
        raise invalid_request(
            f"Invalid value for '{path}.type': {kind!r}. openinfer supports tools of type 'function'.",
            param=f"{path}.type",
        )
    function = tool.get("function")
    if not isinstance(function, dict):
        raise missing_parameter(f"{path}.function") if function is None else _not_object(f"{path}.function")
    name = function.get("name")
    if name is None:
        raise missing_parameter(f"{path}.function.name")
    if not isinstance(name, str) or FUNCTION_NAME.fullmatch(name) is None:
        raise invalid_request(
            f"Invalid '{path}.function.name': {name!r} does not match pattern. Expected a string that "
            "matches the pattern '^[a-zA-Z0-9_-]{1,64}$'.",
            param=f"{path}.function.name",
        )
    for key, kind_ok, words in (
        ("description", str, "a string"),
        ("parameters", dict, "an object (a JSON schema)"),
        ("strict", bool, "true or false"),
    ):
        if function.get(key) is not None and not isinstance(function[key], kind_ok):
            raise invalid_request(f"`{path}.function.{key}` must be {words}", param=f"{path}.function.{key}")


def _choice(value: object, names: list[str]) -> ToolChoice:
    if value is None or value == "none":
        return "none"
    if value == "auto":
        return "auto"
    if value == "required":
        return "required"
    if isinstance(value, str) or not isinstance(value, dict):
        raise invalid_request(
            f"Invalid value for 'tool_choice': {value!r}. Supported values are: 'none', 'auto', "
            f"'required', and {_NAMED}.",
            param="tool_choice",
        )
    if value.get("type", "function") != "function":
        raise invalid_request(f"Invalid value for 'tool_choice.type': {_NAMED}", param="tool_choice.type")
    function = value.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise invalid_request(f"Invalid value for 'tool_choice': {_NAMED}", param="tool_choice.function.name")
    name: str = function["name"]
    if names and name not in names:
        raise invalid_request(
            f"Invalid value for 'tool_choice': the function {name!r} is not in 'tools' (they are: "
            f"{', '.join(names)}).",
            param="tool_choice",
        )
    return NamedToolChoice(name)


def _check_allowed(choice: ToolChoice, parsers: ChatParsers) -> None:
    """vLLM's answers where the server was not started to parse tool calls."""
    if choice == "auto" and not parsers.enable_auto_tool_choice:
        raise invalid_request(
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set '
            '(send tool_choice "none" to render the tools without parsing calls)',
            param="tool_choice",
        )
    if choice not in ("none", "auto") and parsers.tool_call_parser is None:
        described = f'function "{choice.name}"' if isinstance(choice, NamedToolChoice) else f'"{choice}"'
        raise invalid_request(f"tool_choice={described} requires --tool-call-parser to be set", "tool_choice")


def _not_object(path: str) -> ApiError:
    return invalid_request(f"`{path}` must be an object", param=path)
