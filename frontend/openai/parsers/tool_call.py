"""One tool call a model made, as OpenAI's ``tool_calls`` entries carry it."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """A function call: ``arguments`` is the JSON text of an object (OpenAI's ``function.arguments``)."""

    id: str  # "chatcmpl-tool-" and 16 hex digits, as vLLM's
    name: str
    arguments: str

    @classmethod
    def of(cls, name: str, arguments: dict[str, Any]) -> ToolCall:
        """A new call with a fresh id; the arguments serialized as vLLM does (``json.dumps``, not ASCII)."""
        return cls(f"chatcmpl-tool-{uuid.uuid4().hex[:16]}", name, json.dumps(arguments, ensure_ascii=False))

    def to_json(self) -> dict[str, Any]:
        """The entry of ``message.tool_calls``."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def load_json(text: str) -> object | None:
    """``text`` (surrounding whitespace aside) as JSON, or None when it is not JSON."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the interpreter's stack
        return None
