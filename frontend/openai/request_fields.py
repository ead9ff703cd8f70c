"""Typed reads of a JSON request body's fields; each bad value is a 400 that names its field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from openinfer.frontend.openai.errors import invalid_request


def decode_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object; 400 when it is not JSON or not an object."""
    try:
        fields = msgspec.json.decode(body)
    except msgspec.DecodeError as e:
        raise invalid_request(f"the request body is not valid JSON: {e}") from None
    if not isinstance(fields, dict):
        raise invalid_request("the request body must be a JSON object")
    return fields


def refuse_unsupported(
    fields: Mapping[str, Any], unsupported: Mapping[str, tuple[tuple[Any, ...], str]]
) -> None:
    """400 for a parameter openinfer does not honour, unless it has one of its neutral values.

    ``unsupported`` maps a name to (the values that mean "not used", the message for any other value):
    refusing is better than silently ignoring what a client asked for.
    """
    for name, (neutral, message) in unsupported.items():
        if name in fields and not any(_same(fields[name], value) for value in neutral):
            raise invalid_request(message, param=name)


def read_int(fields: Mapping[str, Any], name: str, default: int | None) -> int | None:
    value = fields.get(name, default)
    if value is not None and not is_int(value):
        raise invalid_request(f"`{name}` must be an integer", param=name)
    return value


def read_number(fields: Mapping[str, Any], name: str, default: float) -> float:
    value = fields.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid_request(f"`{name}` must be a number", param=name)
    return float(value)


def read_bool(fields: Mapping[str, Any], name: str, default: bool) -> bool:
    value = fields.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid_request(f"`{name}` must be true or false", param=name)
    return value


def read_token_ids(value: object, name: str) -> list[int]:
    if not isinstance(value, list) or not all(is_int(t) and t >= 0 for t in value):
        raise invalid_request(f"`{name}` must be a list of non-negative integer token ids", param=name)
    return value


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _same(value: object, neutral: object) -> bool:
    """Equal and of the same kind (``True`` is not ``1`` here, and ``0.0`` is ``0``)."""
    if isinstance(value, bool) != isinstance(neutral, bool):
        return False
    return value == neutral
