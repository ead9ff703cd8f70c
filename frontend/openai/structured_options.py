"""Structured outputs, as both endpoints take them: OpenAI's ``response_format`` and vLLM's
``structured_outputs`` (``json``, ``regex``, ``choice``, ``grammar`` or ``json_object``), validated into the
engine's :class:`StructuredOutputs`.

As vLLM: a non-text ``response_format`` replaces the constraint of ``structured_outputs`` and keeps its
options (``disable_any_whitespace``, ``disable_additional_properties``). Where xgrammar is installed (not in
the slim frontend image) the server compiles a constraint without a tokenizer before it reaches an engine
(:mod:`~openinfer.frontend.openai.grammar_pool`), so that what does not compile, or takes too long to, is a
400 naming its field; elsewhere the engine refuses it, a 400 too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from openinfer.frontend.openai.body.decode import check_nesting
from openinfer.frontend.openai.errors import ApiError, invalid_request, missing_parameter
from openinfer.frontend.openai.structured_constraint import StructuredConstraint
from openinfer.protocol import StructuredKind, StructuredOutputs

RESPONSE_FORMAT = "response_format"
STRUCTURED_OUTPUTS = "structured_outputs"
# vLLM's StructuredOutputsParams constraints (structural_tag aside), one of which a request may set
CONSTRAINTS: tuple[StructuredKind, ...] = ("json", "regex", "choice", "grammar", "json_object")
RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")


@dataclass(frozen=True)
class _Options:
    """``structured_outputs``' options, which also apply to a ``response_format``'s constraint."""

    any_whitespace: bool = True  # not disable_any_whitespace
    no_additional_properties: bool = False  # disable_additional_properties


def parse_structured(response_format: object, structured_outputs: object) -> StructuredConstraint | None:
    """The constraint the two body fields ask for (None: none); 400 naming the bad field."""
    from_format = _response_format(response_format)
    fields = _object(structured_outputs, STRUCTURED_OUTPUTS)
    options = _Options()
    from_fields = None
    if fields is not None:  # its constraint is checked even where response_format's replaces it
        options = _options(fields)
        from_fields = _structured_outputs(fields, required=from_format is None)
    if from_format is not None:
        (kind, value), param = from_format, RESPONSE_FORMAT
    elif from_fields is not None:
        (kind, value), param = from_fields, STRUCTURED_OUTPUTS
    else:
        return None
    if kind == "json":
        return json_constraint(value, param, options.any_whitespace, options.no_additional_properties)
    if kind == "choice":
        spec = _compact_json(value)  # the list of strings
    elif kind == "json_object":
        spec = ""
    else:
        spec = value  # the regex, or the EBNF grammar
    return StructuredConstraint(StructuredOutputs(kind, spec, options.any_whitespace), param)


def json_constraint(
    schema: dict[str, Any],
    param: str,
    any_whitespace: bool = True,
    no_additional_properties: bool = False,
) -> StructuredConstraint:
    """Output that is JSON of ``schema``, whose text the engine gets compact and in the given order."""
    if no_additional_properties:
        schema = without_additional_properties(schema)
    return StructuredConstraint(StructuredOutputs("json", _compact_json(schema), any_whitespace), param)


def without_additional_properties(schema: Any) -> Any:
    """A copy of ``schema`` where every object schema with ``properties`` or ``patternProperties`` and no
    ``additionalProperties`` has ``additionalProperties: false`` (vLLM's disable_additional_properties).
    Walked with a stack, not recursion: a body may nest as deep as its decoder allows."""
    root = [schema]
    pending: list[tuple[Any, Any]] = [(root, 0)]  # (container, key) whose value is still the client's
    while pending:
        container, key = pending.pop()
        value = container[key]
        if isinstance(value, dict):
            value = dict(value)
            if "additionalProperties" not in value and (
                "properties" in value or "patternProperties" in value
            ):
                value["additionalProperties"] = False
            pending.extend((value, k) for k in value)
        elif isinstance(value, list):
            value = list(value)
            pending.extend((value, i) for i in range(len(value)))
        container[key] = value
    return root[0]


def _response_format(value: object) -> tuple[StructuredKind, Any] | None:
    """OpenAI's response_format: None for text (or absent), else the constraint kind and its value."""
    fields = _object(value, RESPONSE_FORMAT)
    if fields is None:
        return None
    kind = fields.get("type")
    if kind is None:
        raise missing_parameter("response_format.type", RESPONSE_FORMAT)
    if kind == "structural_tag":
        raise invalid_request(
            '`response_format` of type "structural_tag" is not supported by openinfer: use "json_schema", '
            'or `structured_outputs` with "json", "regex", "choice" or "grammar"',
            param=RESPONSE_FORMAT,
        )
    if kind not in RESPONSE_FORMAT_TYPES:
        raise invalid_request(
            f"Invalid value for 'response_format.type': {kind!r}. Supported values are: 'text', "
            "'json_object' and 'json_schema'.",
            param=RESPONSE_FORMAT,
        )
    if kind == "text":
        return None
    if kind == "json_object":
        return "json_object", True
    return "json", _json_schema_format(fields.get("json_schema"))


def _json_schema_format(value: object) -> dict[str, Any]:
    """``response_format.json_schema``: ``{"name", "schema", "description"?, "strict"?}``; its schema."""
    if value is None:
        raise invalid_request(
            'When response_format type is "json_schema", the "json_schema" field must be provided.',
            param=RESPONSE_FORMAT,
        )
    if not isinstance(value, dict):
        raise _wrong("response_format.json_schema", "an object", RESPONSE_FORMAT)
    if value.get("name") is None:
        raise missing_parameter("response_format.json_schema.name", RESPONSE_FORMAT)
    for key, kind_ok, words in (
        ("name", str, "a string"),
        ("description", str, "a string"),
        ("strict", bool, "true or false"),
    ):
        if value.get(key) is not None and not isinstance(value[key], kind_ok):
            raise _wrong(f"response_format.json_schema.{key}", words, RESPONSE_FORMAT)
    schema = value.get("schema")
    if schema is None:
        raise missing_parameter("response_format.json_schema.schema", RESPONSE_FORMAT)
    if not isinstance(schema, dict):
        raise _wrong("response_format.json_schema.schema", "an object (a JSON schema)", RESPONSE_FORMAT)
    return schema


def _options(fields: dict[str, Any]) -> _Options:
    """``structured_outputs``' options; the ones openinfer cannot honour are refused unless null."""
    for key in ("whitespace_pattern", "structural_tag"):
        if fields.get(key) is not None:
            raise invalid_request(
                f"`structured_outputs.{key}` is not supported by openinfer", param=STRUCTURED_OUTPUTS
            )
    flags = {}
    for key in ("disable_any_whitespace", "disable_additional_properties"):
        flag = fields.get(key)
        if flag is not None and not isinstance(flag, bool):
            raise _wrong(f"structured_outputs.{key}", "true or false", STRUCTURED_OUTPUTS)
        flags[key] = flag is True
    return _Options(not flags["disable_any_whitespace"], flags["disable_additional_properties"])


def _structured_outputs(fields: dict[str, Any], required: bool) -> tuple[StructuredKind, Any] | None:
    """The one constraint ``structured_outputs`` sets, checked; 400 for several (vLLM's words), or for none
    where it is ``required`` (no response_format gives one); None for none otherwise."""
    given = [kind for kind in CONSTRAINTS if fields.get(kind) is not None]
    if not given and not required:
        return None
    if not given:
        raise invalid_request(
            "You must use one kind of structured outputs constraint but none are specified: set one of "
            "`json`, `regex`, `choice`, `grammar` or `json_object`",
            param=STRUCTURED_OUTPUTS,
        )
    if len(given) > 1:
        raise invalid_request(
            "You can only use one kind of structured outputs constraint but multiple are specified: "
            + ", ".join(f"`{kind}`" for kind in given),
            param=STRUCTURED_OUTPUTS,
        )
    kind = given[0]
    value = fields[kind]
    if kind == "json":
        return kind, _json_schema(value)
    if kind == "json_object" and value is not True:
        raise _wrong("structured_outputs.json_object", "true (or left out)", STRUCTURED_OUTPUTS)
    if kind in ("regex", "grammar") and not isinstance(value, str):
        raise _wrong(f"structured_outputs.{kind}", "a string", STRUCTURED_OUTPUTS)
    if kind == "choice" and not (
        isinstance(value, list) and value and all(isinstance(item, str) for item in value)
    ):
        raise _wrong("structured_outputs.choice", "a non-empty list of strings", STRUCTURED_OUTPUTS)
    return kind, value


def _json_schema(value: object) -> dict[str, Any]:
    """``structured_outputs.json``: a JSON schema object, or a string holding one."""
    if isinstance(value, str):
        try:
            value = msgspec.json.decode(value)
        except (msgspec.DecodeError, RecursionError) as e:  # as the body's own decoder: too deep is bad JSON
            raise invalid_request(
                f"`structured_outputs.json` is a string but not JSON: {e}", param=STRUCTURED_OUTPUTS
            ) from None
        check_nesting(value, STRUCTURED_OUTPUTS)  # as deep as the body's own fields may be
    if not isinstance(value, dict):
        raise _wrong(
            "structured_outputs.json", "a JSON schema: an object, or a string holding one", STRUCTURED_OUTPUTS
        )
    return value


def _object(value: object, name: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _wrong(name, "an object", name)
    return value


def _compact_json(value: object) -> str:
    """JSON text without spaces, keys in the order given (a schema's property order is its output's)."""
    return msgspec.json.encode(value).decode()


def _wrong(path: str, words: str, param: str) -> ApiError:
    return invalid_request(f"`{path}` must be {words}", param=param)
