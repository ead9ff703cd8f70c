"""A JSON request body decoded into its msgspec struct; each bad value is a 400 that names its field."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec

from openinfer.frontend.openai.errors import ApiError, invalid_request

BodyT = TypeVar("BodyT", bound=msgspec.Struct)

# "Expected `int | null`, got `str`": msgspec's words for a value of the wrong JSON type
_WRONG_TYPE = re.compile(r"Expected `(?P<expected>[^`]+)`, got `[^`]+`")
_TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "object": "an object",
    "array": "a list",
}


def decode_body(body: bytes, body_type: type[BodyT], type_messages: Mapping[str, str]) -> BodyT:
    """``body`` as a ``body_type``; 400 when it is not JSON, not an object, or holds a value of a wrong type.

    The 400 names the top-level field the bad value is in. Its message says what the field must be (`` `top_k`
    must be an integer``), or is ``type_messages[field]`` where that would say it badly (unions such as
    ``prompt``). Unknown fields are ignored.
    """
    try:
        return msgspec.json.decode(body, type=body_type)
    except msgspec.ValidationError as e:
        error = str(e)
    except msgspec.DecodeError as e:
        raise _not_json(e) from None
    try:  # msgspec checks types as it parses: a syntax error may come after the type error
        msgspec.json.decode(body)
    except msgspec.DecodeError as e:  # also a number out of range, a ValidationError
        raise _not_json(e) from None
    raise _type_error(error, type_messages)


def refuse_unsupported(body: msgspec.Struct, unsupported: Mapping[str, tuple[tuple[Any, ...], str]]) -> None:
    """400 for a parameter openinfer does not honour, unless it has one of its neutral values.

    ``unsupported`` maps a field of ``body`` to (the values that mean "not used", None among them, the message
    for any other value): refusing is better than silently ignoring what a client asked for.
    """
    fields = msgspec.structs.asdict(body)
    for name, (neutral, message) in unsupported.items():
        if not any(_same(fields[name], value) for value in neutral):
            raise invalid_request(message, param=name)


def _not_json(error: msgspec.DecodeError) -> ApiError:
    return invalid_request(f"the request body is not valid JSON: {error}")


def _type_error(error: str, type_messages: Mapping[str, str]) -> ApiError:
    """The 400 for msgspec's ``error``, e.g. "Expected `int | null`, got `str` - at `$.max_tokens`"."""
    detail, _, location = error.partition(" - at `$")
    path = location.removesuffix("`").removeprefix(".")  # "max_tokens", "messages[0]", "" for the body
    if not path:
        return invalid_request("the request body must be a JSON object")
    field = re.split(r"[.\[]", path, maxsplit=1)[0]
    wrong_type = _WRONG_TYPE.fullmatch(detail)
    if field in type_messages:
        message = type_messages[field]
    elif wrong_type is not None:
        kinds = [kind for kind in wrong_type["expected"].split(" | ") if kind != "null"]
        message = f"`{path}` must be {' or '.join(_TYPE_WORDS.get(kind, kind) for kind in kinds)}"
    else:
        message = f"`{path}`: {detail}"
    return invalid_request(message, param=field)


def _same(value: object, neutral: object) -> bool:
    """Equal and of the same kind (``True`` is not ``1`` here, and ``0.0`` is ``0``)."""
    if isinstance(value, bool) != isinstance(neutral, bool):
        return False
    return value == neutral
