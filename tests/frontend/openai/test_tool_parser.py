"""--tool-call-parser hermes: <tool_call> blocks into calls, the rest content, whole and streamed at every
split point; malformed and unfinished blocks stay content; whitespace-only text around calls is dropped."""

from __future__ import annotations

import json

import pytest

from openinfer.frontend.openai.parsers.hermes_tools import HermesToolParser, parse_hermes_call
from openinfer.frontend.openai.parsers.tool_call import ToolCall

WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
TIME = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
BAD = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>'  # a brace short
W, T = ("get_weather", {"city": "Paris", "days": 2}), ("get_time", {})

# (output, content, calls as (name, arguments))
CASES = [
    ("Just text.\n", "Just text.\n", []),  # no call: untouched, whitespace and all
    (WEATHER, "", [W]),
    (f"Let me check.\n{WEATHER}", "Let me check.\n", [W]),  # as vLLM's
    (f"{WEATHER}\n{TIME}\n", "", [W, T]),  # Qwen3's newlines between and after calls
    (f" \n{WEATHER}\nDone.\n", "\nDone.\n", [W]),  # text after a call is content too
    (f"A {WEATHER} B {TIME} C", "A  B  C", [W, T]),  # only text that is all whitespace goes
    (" \n ", " \n ", []),
    (BAD, BAD, []),  # malformed JSON is content, tags and all
    (f"{WEATHER}\n{BAD}", f"\n{BAD}", [W]),  # one bad block spoils only itself
    ('<tool_call>\n{"name": "get_time", "arguments": {}}', "", [T]),  # unclosed, but the body parses
    ('<tool_call>\n{"name": "get_weather", "argu', '<tool_call>\n{"name": "get_weather", "argu', []),  # cut
    (f"<tool_call>\n{WEATHER}", "<tool_call>\n", [W]),  # a block that never closed before the next
    ("", "", []),
]  # fmt: skip
# Outputs that are all content, as written.
CASES += [
    (output, output, [])
    for output in (
        "</tool_call> stray",
        "<tool_call>[1, 2]</tool_call>",  # not an object
        '<tool_call>{"name": "f", "arguments": "{}"}</tool_call>',  # arguments not an object
        '<tool_call>{"name": "", "arguments": {}}</tool_call>',
        '<tool_call>{"arguments": {}}</tool_call>',
        "<tool_call>" + "[" * 100_000 + "</tool_call>",  # deeper than json can go
        "a <tool_call",  # a tag's start at the end is text
    )
]


def parse(pieces: list[str]) -> tuple[str, list[tuple[str, object]]]:
    """(content, [(name, arguments)]) of the pieces fed in order, then finish."""
    parser = HermesToolParser()
    out = [item for piece in pieces for item in parser.feed(piece)] + parser.finish()
    assert all(item != "" for item in out)
    content = "".join(item for item in out if isinstance(item, str))
    calls = [(c.name, json.loads(c.arguments)) for c in out if isinstance(c, ToolCall)]
    return content, calls


@pytest.mark.parametrize(("output", "content", "calls"), CASES)
def test_blocks_become_calls_at_every_split_point(
    output: str, content: str, calls: list[tuple[str, object]]
) -> None:
    """Whole, cut in two anywhere, and character by character: the same content and calls."""
    assert parse([output]) == (content, calls)
    if len(output) < 1000:
        for cut in range(len(output) + 1):
            assert parse([output[:cut], output[cut:]]) == (content, calls), cut
        assert parse(list(output)) == (content, calls)


def test_a_call_is_released_when_its_block_closes() -> None:
    """Nothing of a block is released before its </tool_call>; the call comes whole, with a fresh id and
    its arguments as vLLM serializes them; text before it comes at once."""
    parser = HermesToolParser()
    assert parser.feed('Sure.\n<tool_call>\n{"name": "get_time",') == ["Sure.\n"]
    assert parser.feed(' "arguments": {"zone":"CET", "n": "日本"}}\n</tool') == []
    [call] = parser.feed("_call>")
    assert (call.name, call.arguments) == ("get_time", '{"zone": "CET", "n": "日本"}')
    assert call.id.startswith("chatcmpl-tool-") and len(call.id) == len("chatcmpl-tool-") + 16
    assert call.to_json() == {"id": call.id, "type": "function",
                              "function": {"name": "get_time", "arguments": call.arguments}}  # fmt: skip
    assert parser.finish() == []


def test_ids_are_unique() -> None:
    """Every call gets its own id."""
    calls = [parse_hermes_call('{"name": "f", "arguments": {}}') for _ in range(100)]
    assert len({call.id for call in calls if call is not None}) == 100
