"""tools / tool_choice / parallel_tool_calls: OpenAI's 400s naming the bad part, vLLM's answers per server
flags, and the forced-call schema (the JSON constraint of a forced call's decoding) with its parse."""

from __future__ import annotations

import json
from typing import Any

import pytest

from openinfer.frontend.openai.chat_tools import ChatTools, NamedToolChoice, parse_chat_tools
from openinfer.frontend.openai.errors import ApiError
from openinfer.frontend.openai.parsers.chat_parsers import ChatParsers
from tests.frontend.openai.tool_specs import ALL_ON, TOOLS, WEATHER, WEATHER_PARAMETERS


def tools(
    value: object = TOOLS, choice: object = None, parallel: object = None, parsers: ChatParsers = ALL_ON
) -> ChatTools:
    return parse_chat_tools(value, choice, parallel, parsers)


@pytest.mark.parametrize(
    ("choice", "expected"),
    [(None, "auto"), ("auto", "auto"), ("none", "none"), ("required", "required"),
     ({"type": "function", "function": {"name": "get_time"}}, NamedToolChoice("get_time")),
     ({"function": {"name": "get_time"}}, NamedToolChoice("get_time"))],
)  # fmt: skip
def test_choices(choice: object, expected: object) -> None:
    """Each tool_choice form; with tools and no choice, "auto" (OpenAI's and vLLM's default)."""
    parsed = tools(choice=choice)
    assert parsed.choice == expected and parsed.tools == TOOLS
    assert parsed.parses_calls == (expected != "none")


def test_no_tools() -> None:
    """No tools: choice "none" (also when sent), nothing parsed; parallel calls default to allowed."""
    assert tools(None) == ChatTools(None, "none", True)
    assert tools(None, "none", False) == ChatTools(None, "none", False)


@pytest.mark.parametrize(
    ("value", "choice", "parallel", "param", "words"),
    [
        ({}, None, None, "tools", "must be a list"),
        ([], None, None, "tools", "empty array"),
        (["f"], None, None, "tools[0]", "must be an object"),
        ([{"type": "web_search"}], None, None, "tools[0].type", "'function'"),
        ([{"type": "function"}], None, None, "tools[0].function", "Missing required parameter"),
        ([{"type": "function", "function": "f"}], None, None, "tools[0].function", "must be an object"),
        ([WEATHER, {"function": {"description": "x"}}], None, None, "tools[1].function.name", "Missing"),
        ([{"function": {"name": "get weather"}}], None, None, "tools[0].function.name", "pattern"),
        ([{"function": {"name": "f" * 65}}], None, None, "tools[0].function.name", "pattern"),
        ([{"function": {"name": 3}}], None, None, "tools[0].function.name", "pattern"),
        ([{"function": {"name": "f", "parameters": []}}], None, None, "tools[0].function.parameters", "object"),
        ([{"function": {"name": "f", "description": 1}}], None, None, "tools[0].function.description", "string"),
        ([{"function": {"name": "f", "strict": "yes"}}], None, None, "tools[0].function.strict", "true or false"),
        (TOOLS, "sometimes", None, "tool_choice", "Supported values"),
        (TOOLS, 3, None, "tool_choice", "Supported values"),
        (TOOLS, {"type": "tool"}, None, "tool_choice.type", "named function"),
        (TOOLS, {"type": "function"}, None, "tool_choice.function.name", "named function"),
        (TOOLS, {"type": "function", "function": {"name": "get_news"}}, None, "tool_choice", "not in 'tools'"),
        (None, "auto", None, "tool_choice", "only allowed when 'tools' are specified"),
        (None, "required", None, "tool_choice", "only allowed when 'tools'"),
        (None, {"type": "function", "function": {"name": "f"}}, None, "tool_choice", "only allowed"),
        (TOOLS, None, "yes", "parallel_tool_calls", "true or false"),
    ],
)  # fmt: skip
def test_bad_tool_fields_are_400s_naming_the_part(
    value: object, choice: object, parallel: object, param: str, words: str
) -> None:
    """Each malformed field is an OpenAI 400 (invalid_request_error) whose param names the bad part."""
    with pytest.raises(ApiError) as raised:
        tools(value, choice, parallel)
    assert raised.value.status == 400 and raised.value.type == "invalid_request_error"
    assert raised.value.param == param and words in raised.value.message, raised.value.message


@pytest.mark.parametrize(
    ("parsers", "choice", "words"),
    [
        (ChatParsers(), None, '"auto" tool choice requires --enable-auto-tool-choice'),
        (ChatParsers(), "auto", '"auto" tool choice requires --enable-auto-tool-choice'),
        (ChatParsers(tool_call_parser="hermes"), "auto", "--enable-auto-tool-choice"),
        (ChatParsers(), "required", 'tool_choice="required" requires --tool-call-parser'),
        (ChatParsers(reasoning_parser="qwen3"), {"function": {"name": "get_time"}},
         'tool_choice=function "get_time" requires --tool-call-parser'),
    ],
)  # fmt: skip
def test_choices_the_server_cannot_parse_are_refused_as_vllm_does(
    parsers: ChatParsers, choice: object, words: str
) -> None:
    """Without --enable-auto-tool-choice, tools (default "auto") are vLLM's 400; "required" and named
    functions need --tool-call-parser; "none" always works (the template still sees the tools)."""
    with pytest.raises(ApiError) as raised:
        tools(choice=choice, parsers=parsers)
    assert raised.value.param == "tool_choice" and words in raised.value.message
    assert tools(choice="none", parsers=ChatParsers()).tools == TOOLS
    assert tools(choice="required", parsers=ChatParsers(tool_call_parser="hermes")).choice == "required"


def test_named_choice_schema_is_the_functions_parameters() -> None:
    """A named function's output is its arguments: its parameters schema, or any object without one."""
    assert tools(choice={"function": {"name": "get_weather"}}).output_schema() == WEATHER_PARAMETERS
    assert tools(choice={"function": {"name": "get_time"}}).output_schema() == {
        "type": "object",
        "properties": {},
    }
    assert tools(choice="auto").output_schema() is None and tools(choice="none").output_schema() is None


@pytest.mark.parametrize("parallel", [None, True, False])
def test_required_schema_is_an_array_of_calls(parallel: bool | None) -> None:
    """ "required": at least one {"name", "parameters"} of the tools (at most one if parallel is false)."""
    schema = tools(choice="required", parallel=parallel).output_schema()
    expected: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": {"type": "object", "anyOf": [
            {"properties": {"name": {"type": "string", "enum": ["get_weather"]}, "parameters": WEATHER_PARAMETERS},
             "required": ["name", "parameters"]},
            {"properties": {"name": {"type": "string", "enum": ["get_time"]},
                            "parameters": {"type": "object", "properties": {}}},
             "required": ["name", "parameters"]},
        ]},
    }  # fmt: skip
    if parallel is False:
        expected["maxItems"] = 1
    assert schema == expected


def test_required_schema_gathers_defs() -> None:
    """Each function's $defs move to the array's, where their $refs point; a clash is a 400 on tools."""
    point = {"type": "object", "properties": {"x": {"type": "number"}}}
    with_defs = {"type": "object", "properties": {"at": {"$ref": "#/$defs/Point"}}, "$defs": {"Point": point}}
    offered = [{"function": {"name": name, "parameters": with_defs}} for name in ("go", "stay")]
    schema = tools(offered, "required").output_schema()
    assert schema is not None and schema["$defs"] == {"Point": point}
    without_defs = {"type": "object", "properties": {"at": {"$ref": "#/$defs/Point"}}}
    assert schema["items"]["anyOf"][0]["properties"]["parameters"] == without_defs
    assert "$defs" in with_defs  # the request's own tools are left as sent (the template renders them)
    clash = json.loads(json.dumps(offered))
    clash[1]["function"]["parameters"]["$defs"]["Point"] = {"type": "string"}
    with pytest.raises(ApiError, match="define `\\$defs.Point` differently") as raised:
        tools(clash, "required")
    assert raised.value.param == "tools"


@pytest.mark.parametrize(
    ("choice", "output", "calls"),
    [
        ({"function": {"name": "get_weather"}}, ' {"city": "Paris"} ', [("get_weather", {"city": "Paris"})]),
        ({"function": {"name": "get_weather"}}, "Paris", None),  # not the forced form: read as "auto"
        ({"function": {"name": "get_weather"}}, "[]", None),
        ("required", '[{"name": "get_time", "parameters": {}},\n {"name": "get_weather", "parameters": {"c": 1}}]',
         [("get_time", {}), ("get_weather", {"c": 1})]),
        ("required", "[]", None),
        ("required", '[{"name": "get_time"}]', None),
        ("required", '{"name": "get_time", "parameters": {}}', None),
        ("auto", '{"city": "Paris"}', None),
    ],
)  # fmt: skip
def test_forced_calls_read_the_forced_form(choice: object, output: str, calls: list[Any] | None) -> None:
    """The calls an output of the schema's form makes; None for any other output."""
    found = tools(choice=choice).forced_calls(output)
    assert (None if found is None else [(c.name, json.loads(c.arguments)) for c in found]) == calls
