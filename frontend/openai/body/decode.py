"""A JSON request body decoded into its msgspec struct; each bad value is a 400 that names its field.

Integers are 64-bit (:data:`Int64`, vLLM's range for ``seed``; the engine's wire format holds no more), so a
value past it is refused where the body is decoded, never found out after a request was admitted. JSON
nests at most :data:`MAX_NESTING` levels: a deeper body is a 400 before anything walks it recursively.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Mapping
from itertools import chain, compress, repeat
from typing import Annotated, Any, TypeVar

import msgspec

from openinfer.frontend.openai.errors import ApiError, invalid_request, missing_parameter

BodyT = TypeVar("BodyT", bound=msgspec.Struct)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
Int64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
# Arrays and objects within one another, the body's own object included. Far above what a JSON schema or a
# chat message needs, far below Python's recursion limit (1000), which templates and encoders walk under.
MAX_NESTING = 128

# "Expected `int | null`, got `str`": msgspec's words for a value of the wrong JSON type
_WRONG_TYPE = re.compile(r"Expected `(?P<expected>[^`]+)`, got `[^`]+`")
# "Expected `int` <= 9223372036854775807": a value past one of Int64's bounds
_OUT_OF_RANGE = re.compile(rf"Expected `int` (<= {INT64_MAX}|>= {INT64_MIN})")
_MISSING_FIELD = re.compile(r"Object missing required field `(?P<name>[^`]+)`")
_UNKNOWN_FIELD = re.compile(r"Object contains unknown field `(?P<name>[^`]+)`")
_TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "object": "an object",
    "array": "a list",
}


def decode_body(body: bytes, body_type: type[BodyT], type_messages: Mapping[str, str]) -> BodyT:
    """``body`` as a ``body_type``; 400 when it is not JSON, not an object, nests too deeply, or holds a value
    of a wrong type or outside its range.

    The 400 names the top-level field the bad value is in. Its message says what the field must be (`` `top_k`
    must be an integer``), or is ``type_messages[field]`` where that would say it badly (unions such as
    ``prompt``). Unknown fields are ignored unless ``body_type`` forbids them.
    """
    try:
        decoded = msgspec.json.decode(body, type=body_type)
    except msgspec.ValidationError as e:
        error = str(e)
    except msgspec.DecodeError as e:
        raise _not_json(e) from None
    except RecursionError:  # msgspec's decoder stops at Python's recursion limit
        raise _too_deep("the request body") from None
    else:
        for name in _nesting_fields(body_type):
            check_nesting(getattr(decoded, name), name)
        return decoded
    try:  # msgspec checks types as it parses: a syntax error may come after the type error
        msgspec.json.decode(body)
    except msgspec.DecodeError as e:  # also a number out of range, a ValidationError
        raise _not_json(e) from None
    except RecursionError:
        raise _too_deep("the request body") from None
    raise _type_error(error, type_messages)


def check_nesting(value: object, param: str) -> None:
    """400 naming ``param`` when ``value`` (a field of a body) nests arrays and objects more than
    ``MAX_NESTING - 1`` deep. Walked level by level, not recursively; each level's containers are gathered
    by itertools in C, so a wide value costs about what decoding it did (about 2x for a million lists)."""
    lists = [value] if type(value) is list else []  # msgspec decodes JSON to exact lists and dicts
    dicts = [value] if type(value) is dict else []
    level = 2  # of ``value``; the body's object is level 1
    while lists or dicts:
        if level > MAX_NESTING:
            raise _too_deep(f"`{param}`", param)
        children = list(chain(chain.from_iterable(lists), chain.from_iterable(map(dict.values, dicts))))
        types = list(map(type, children))
        lists = list(compress(children, map(operator.is_, types, repeat(list))))
        dicts = list(compress(children, map(operator.is_, types, repeat(dict))))
        level += 1


def refuse_unsupported(body: msgspec.Struct, unsupported: Mapping[str, tuple[tuple[Any, ...], str]]) -> None:
    """400 for a parameter openinfer does not honour, unless it has one of its neutral values.

    ``unsupported`` maps a field of ``body`` to (the values that mean "not used", None among them, the message
    for any other value): refusing is better than silently ignoring what a client asked for.
    """
    fields = msgspec.structs.asdict(body)
    for name, (neutral, message) in unsupported.items():
        if not any(_same(fields[name], value) for value in neutral):
            raise invalid_request(message, param=name)


@functools.cache  # msgspec.inspect takes milliseconds per struct: once per body type, not per request
def _nesting_fields(body_type: type[msgspec.Struct]) -> tuple[str, ...]:
    """The fields of ``body_type`` whose type holds ``Any`` somewhere: the only ones a client can nest as
    deep as it likes (the others' types bound their depth, and a long token-id list is not walked)."""
    info = msgspec.inspect.type_info(body_type)
    assert isinstance(info, msgspec.inspect.StructType)
    return tuple(field.name for field in info.fields if _holds_any(field.type))


def _holds_any(t: msgspec.inspect.Type) -> bool:
    if isinstance(t, msgspec.inspect.AnyType):
        return True
    if isinstance(t, msgspec.inspect.UnionType):
        return any(_holds_any(member) for member in t.types)
    if isinstance(t, msgspec.inspect.ListType):
        return _holds_any(t.item_type)
    if isinstance(t, msgspec.inspect.DictType):
        return _holds_any(t.key_type) or _holds_any(t.value_type)
    if isinstance(t, msgspec.inspect.StructType):
        return any(_holds_any(field.type) for field in t.fields)
    return False


def _not_json(error: msgspec.DecodeError) -> ApiError:
    return invalid_request(f"the request body is not valid JSON: {error}")


def _too_deep(what: str, param: str | None = None) -> ApiError:
    return invalid_request(
        f"{what} nests arrays and objects more than {MAX_NESTING} levels deep (the body's own object "
        "counts as one); send it flatter",
        param=param,
    )


def _type_error(error: str, type_messages: Mapping[str, str]) -> ApiError:
    """The 400 for msgspec's ``error``, e.g. "Expected `int | null`, got `str` - at `$.max_tokens`"."""
    detail, _, location = error.partition(" - at `$")
    path = location.removesuffix("`").removeprefix(".")  # "max_tokens", "messages[0]", "" for the body
    missing, unknown = _MISSING_FIELD.fullmatch(detail), _UNKNOWN_FIELD.fullmatch(detail)
    if missing is not None:
        name = _joined(path, missing["name"])
        return missing_parameter(name, _top_level(name))
    if unknown is not None:
        name = _joined(path, unknown["name"])
        return invalid_request(f"unknown field `{name}`: this route does not take it", _top_level(name))
    if not path:
        return invalid_request("the request body must be a JSON object")
    field = _top_level(path)
    wrong_type = _WRONG_TYPE.fullmatch(detail)
    if _OUT_OF_RANGE.fullmatch(detail):
        message = f"`{path}` must be an integer in [-2**63, 2**63 - 1] (64 bits)"
    elif field in type_messages:
        message = type_messages[field]
    elif wrong_type is not None:
        kinds = [kind for kind in wrong_type["expected"].split(" | ") if kind != "null"]
        message = f"`{path}` must be {' or '.join(_TYPE_WORDS.get(kind, kind) for kind in kinds)}"
    else:
        message = f"`{path}`: {detail}"
    return invalid_request(message, param=field)


def _joined(path: str, name: str) -> str:
    """The path of field ``name`` of the object at ``path`` ("" for the body's own)."""
    return f"{path}.{name}" if path else name


def _top_level(path: str) -> str:
    """The body field a path is in: "stream_options" of "stream_options.include_usage", "prompt" of
    "prompt[1]"."""
    return re.split(r"[.\[]", path, maxsplit=1)[0]


def _same(value: object, neutral: object) -> bool:
    """Equal and of the same kind (``True`` is not ``1`` here, and ``0.0`` is ``0``)."""
    if isinstance(value, bool) != isinstance(neutral, bool):
        return False
    return value == neutral
