"""response_format and structured_outputs on both endpoints: each accepted form and the exact constraint the
engine gets, each bad form an OpenAI 400 naming its field, vLLM's precedence and additionalProperties rule,
and xgrammar's compile check."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from openinfer.frontend.openai.chat_request import parse_chat_request
from openinfer.frontend.openai.completion_request import parse_completion_request
from openinfer.frontend.openai.errors import ApiError
from openinfer.frontend.openai.grammar_check import CHECKED_KINDS, grammar_error
from openinfer.frontend.openai.structured_constraint import StructuredConstraint
from openinfer.frontend.openai.structured_options import without_additional_properties
from openinfer.frontend.openai.structured_outputs_config import StructuredOutputsConfig
from openinfer.protocol import StructuredOutputs

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
SCHEMA_TEXT = '{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}}'
CLOSED_SCHEMA_TEXT = SCHEMA_TEXT[:-1] + ',"additionalProperties":false}'
JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA}}
ENDPOINTS = ["completions", "chat"]


def structured(endpoint: str, **fields: Any) -> StructuredConstraint | None:
    """The constraint a body with ``fields`` asks for, on ``endpoint``."""
    if endpoint == "completions":
        body = json.dumps({"prompt": "hello", **fields}).encode()
        return parse_completion_request(body).options.structured
    body = json.dumps({"messages": [{"role": "user", "content": "hello"}], **fields}).encode()
    return parse_chat_request(body).options.structured


def from_format(kind: Any, spec: str, any_whitespace: bool = True) -> StructuredConstraint:
    return StructuredConstraint(StructuredOutputs(kind, spec, any_whitespace), "response_format")


def from_fields(kind: Any, spec: str, any_whitespace: bool = True) -> StructuredConstraint:
    return StructuredConstraint(StructuredOutputs(kind, spec, any_whitespace), "structured_outputs")


ACCEPTED = [
    ({}, None),
    ({"response_format": None, "structured_outputs": None}, None),
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}}, from_format("json_object", "")),
    ({"response_format": JSON_SCHEMA_FORMAT}, from_format("json", SCHEMA_TEXT)),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "weather", "schema": SCHEMA, "strict": True, "description": "a forecast"}}},
     from_format("json", SCHEMA_TEXT)),
    ({"structured_outputs": {"json": SCHEMA}}, from_fields("json", SCHEMA_TEXT)),
    # a schema as text is read and written compact, in its own key order
    ({"structured_outputs": {"json": json.dumps(SCHEMA, indent=2)}}, from_fields("json", SCHEMA_TEXT)),
    ({"structured_outputs": {"regex": "[a-z]+ \\d{2}"}}, from_fields("regex", "[a-z]+ \\d{2}")),
    ({"structured_outputs": {"choice": ["yes", "no", "n/a"]}}, from_fields("choice", '["yes","no","n/a"]')),
    ({"structured_outputs": {"grammar": 'root ::= "a" | "b"'}}, from_fields("grammar", 'root ::= "a" | "b"')),
    ({"structured_outputs": {"json_object": True}}, from_fields("json_object", "")),
    ({"structured_outputs": {"regex": "a+", "disable_any_whitespace": True}}, from_fields("regex", "a+", False)),
    ({"structured_outputs": {"json": SCHEMA, "disable_additional_properties": True}},
     from_fields("json", CLOSED_SCHEMA_TEXT)),
    # null constraints and options are absent ones; vLLM's disable_fallback has nothing to fall back from
    ({"structured_outputs": {"choice": ["a"], "json": None, "regex": None, "whitespace_pattern": None,
                             "structural_tag": None, "disable_any_whitespace": None, "disable_fallback": True}},
     from_fields("choice", '["a"]')),
    # a non-text response_format replaces structured_outputs' constraint and keeps its options
    ({"response_format": JSON_SCHEMA_FORMAT, "structured_outputs": {"regex": "a+", "disable_any_whitespace": True}},
     from_format("json", SCHEMA_TEXT, any_whitespace=False)),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"disable_any_whitespace": True}},
     from_format("json_object", "", any_whitespace=False)),
    ({"response_format": JSON_SCHEMA_FORMAT, "structured_outputs": {"disable_additional_properties": True}},
     from_format("json", CLOSED_SCHEMA_TEXT)),
    ({"response_format": {"type": "text"}, "structured_outputs": {"regex": "a+"}}, from_fields("regex", "a+")),
]  # fmt: skip


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize(("fields", "expected"), ACCEPTED)
def test_accepted_forms_are_the_exact_constraint(
    endpoint: str, fields: dict[str, Any], expected: StructuredConstraint | None
) -> None:
    """Each form vLLM takes, on both endpoints, is the engine's StructuredOutputs with the field it came
    from; a json schema is compact JSON text, a choice a JSON list."""
    assert structured(endpoint, **fields) == expected


RF, SO = "response_format", "structured_outputs"
BAD = [
    ({"response_format": "json_object"}, RF, "`response_format` must be an object"),
    ({"response_format": {}}, RF, "Missing required parameter: 'response_format.type'"),
    ({"response_format": {"type": "xml"}}, RF, "Invalid value for 'response_format.type': 'xml'"),
    ({"response_format": {"type": "structural_tag", "structures": []}}, RF, '"structural_tag" is not supported'),
    ({"response_format": {"type": "json_schema"}}, RF, 'the "json_schema" field must be provided'),
    ({"response_format": {"type": "json_schema", "json_schema": SCHEMA}}, RF, "'response_format.json_schema.name'"),
    ({"response_format": {"type": "json_schema", "json_schema": []}}, RF, "`response_format.json_schema` must be"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": 3, "schema": SCHEMA}}}, RF,
     "`response_format.json_schema.name` must be a string"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA, "strict": "yes"}}},
     RF, "`response_format.json_schema.strict` must be true or false"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "w", "description": 1, "schema": SCHEMA}}},
     RF, "`response_format.json_schema.description` must be a string"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "w"}}}, RF,
     "Missing required parameter: 'response_format.json_schema.schema'"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": "{}"}}}, RF,
     "`response_format.json_schema.schema` must be an object (a JSON schema)"),
    ({"structured_outputs": ["regex", "a"]}, SO, "`structured_outputs` must be an object"),
    ({"structured_outputs": {}}, SO, "You must use one kind of structured outputs constraint but none"),
    ({"structured_outputs": {"regex": None, "disable_any_whitespace": True}}, SO, "none are specified"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, SO, "multiple are specified: `regex`, `choice`"),
    # checked even where response_format's constraint would replace it
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"json": SCHEMA, "grammar": "g"}}, SO,
     "multiple are specified: `json`, `grammar`"),
    ({"structured_outputs": {"json": "{'type': 'object'}"}}, SO, "`structured_outputs.json` is a string but not JSON"),
    ({"structured_outputs": {"json": "[1]"}}, SO, "`structured_outputs.json` must be a JSON schema: an object"),
    ({"structured_outputs": {"json": True}}, SO, "`structured_outputs.json` must be a JSON schema"),
    ({"structured_outputs": {"regex": 3}}, SO, "`structured_outputs.regex` must be a string"),
    ({"structured_outputs": {"grammar": ["root ::= 'a'"]}}, SO, "`structured_outputs.grammar` must be a string"),
    ({"structured_outputs": {"choice": []}}, SO, "`structured_outputs.choice` must be a non-empty list of strings"),
    ({"structured_outputs": {"choice": "yes"}}, SO, "non-empty list of strings"),
    ({"structured_outputs": {"choice": ["yes", 1]}}, SO, "non-empty list of strings"),
    ({"structured_outputs": {"json_object": False}}, SO, "`structured_outputs.json_object` must be true"),
    ({"structured_outputs": {"regex": "a", "whitespace_pattern": " *"}}, SO,
     "`structured_outputs.whitespace_pattern` is not supported"),
    ({"structured_outputs": {"regex": "a", "structural_tag": "{}"}}, SO,
     "`structured_outputs.structural_tag` is not supported"),
    ({"structured_outputs": {"regex": "a", "disable_any_whitespace": 1}}, SO,
     "`structured_outputs.disable_any_whitespace` must be true or false"),
    ({"structured_outputs": {"json": SCHEMA, "disable_additional_properties": "no"}}, SO,
     "`structured_outputs.disable_additional_properties` must be true or false"),
    ({"guided_json": SCHEMA}, "guided_json", 'send `structured_outputs: {"json": ...}`'),
    ({"guided_choice": ["a", "b"]}, "guided_choice", "vLLM's deprecated `guided_choice` is not supported"),
]  # fmt: skip


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize(("fields", "param", "words"), BAD)
def test_bad_forms_are_400s_naming_the_field(
    endpoint: str, fields: dict[str, Any], param: str, words: str
) -> None:
    """Each malformed or unsupported form, on both endpoints, is an OpenAI 400 whose param is the body
    field it is in and whose message names the part."""
    with pytest.raises(ApiError) as raised:
        structured(endpoint, **fields)
    assert raised.value.status == 400 and raised.value.type == "invalid_request_error"
    assert raised.value.param == param and words in raised.value.message, raised.value.message


def test_additional_properties_are_closed_where_a_schema_has_properties() -> None:
    """vLLM's disable_additional_properties: every schema with properties or patternProperties and no
    additionalProperties gets it false, however deep (items, $defs, anyOf); an explicit one stays, others
    are untouched, and the client's schema is not changed."""
    schema = {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}}},
            "meta": {"type": "object", "properties": {}, "additionalProperties": {"type": "number"}},
            "any": {"anyOf": [{"$ref": "#/$defs/point"}, {"type": "null"}]},
            "free": {"type": "object"},
        },
        "$defs": {"point": {"patternProperties": {"^x": {"type": "number"}}}},
    }
    sent = json.loads(json.dumps(schema))
    closed = without_additional_properties(schema)
    assert closed == {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}},
                                                "additionalProperties": False}},
            "meta": {"type": "object", "properties": {}, "additionalProperties": {"type": "number"}},
            "any": {"anyOf": [{"$ref": "#/$defs/point"}, {"type": "null"}]},
            "free": {"type": "object"},  # no properties: any object, as vLLM leaves it
        },
        "$defs": {"point": {"patternProperties": {"^x": {"type": "number"}}, "additionalProperties": False}},
        "additionalProperties": False,
    }  # fmt: skip
    assert schema == sent


BAD_COMPILES = [
    (from_fields("json", '{"type":"object","properties":{"a":{"type":"nope"}}}'), 'Unsupported type "nope"'),
    (from_format("json", '{"$ref":"#/$defs/missing"}'), "the JSON schema does not compile"),
    (from_fields("regex", "[a-z"), "the regex does not compile: Regex parsing error at position 5: Unclosed '['"),
    (from_fields("regex", "a{3,1}"), "Lower bound is larger than upper bound"),
    (from_fields("grammar", 'root ::= item\nthing ::= "a"'), 'the grammar does not compile: EBNF parser error'),
    (from_fields("grammar", 'start ::= "a"'), 'The root rule with name "root" is not found'),
]  # fmt: skip


@pytest.mark.parametrize(("constraint", "words"), BAD_COMPILES)
def test_xgrammar_refuses_what_does_not_compile(constraint: StructuredConstraint, words: str) -> None:
    """With xgrammar installed, a schema, regex or grammar it cannot compile has the check's error (the
    grammar pool's 400 message), in xgrammar's words without its log prefix."""
    pytest.importorskip("xgrammar")
    error = grammar_error(constraint.outputs)
    assert error is not None and words in error and ".cc:" not in error, error


# The accepted forms the check compiles: a choice or json_object always compiles, so it checks none.
CHECKED = [expected for _, expected in ACCEPTED if expected and expected.outputs.kind in CHECKED_KINDS]


@pytest.mark.parametrize("expected", CHECKED)
def test_xgrammar_compiles_every_accepted_form(expected: StructuredConstraint) -> None:
    """Each schema, regex and grammar the accepted forms make (the exact constraints the first test pins)
    compiles: its check finds no error."""
    pytest.importorskip("xgrammar")
    assert grammar_error(expected.outputs) is None


def test_without_xgrammar_the_check_leaves_it_to_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The slim frontend image has no xgrammar: the check passes, and the engine refuses what does not
    compile (a bad_request error finish, a 400 too)."""
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # `import xgrammar` raises ImportError
    assert grammar_error(from_fields("regex", "[a-z").outputs) is None


def test_the_servers_structured_outputs_config() -> None:
    """vLLM's --structured-outputs-config: disable_any_whitespace makes every JSON constraint compact; what
    openinfer does not have is refused by name."""
    config = StructuredOutputsConfig.parse('{"backend": "xgrammar", "disable_any_whitespace": true}')
    assert config.argv() == ["--structured-outputs-config", '{"disable_any_whitespace": true}']
    assert (
        StructuredOutputsConfig.parse("{}") == StructuredOutputsConfig()
        and StructuredOutputsConfig().argv() == []
    )
    constraint = from_fields("json", "{}")
    assert config.applied(constraint) == from_fields("json", "{}", any_whitespace=False)
    assert config.applied(None) is None and StructuredOutputsConfig().applied(constraint) is constraint
    # the server's setting is on the parsed request: what the grammar check compiles is what the engine gets
    body = json.dumps({"prompt": "a", "structured_outputs": {"json": {}}}).encode()
    assert parse_completion_request(body, config).options.structured == config.applied(constraint)
    for text, says in (
        ("[]", "JSON object"),
        ("{", "JSON object"),
        ('{"backend": "guidance"}', "xgrammar"),
        ('{"disable_fallback": true}', "no disable_fallback"),
        ('{"disable_any_whitespace": 1}', "true or false"),
    ):
        with pytest.raises(ValueError, match=says):
            StructuredOutputsConfig.parse(text)
