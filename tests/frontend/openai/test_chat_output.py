"""One chat output read by reasoning and tool parsers together: the same message streamed (cut anywhere) or
whole; forced choices read at the end; parallel_tool_calls; include_reasoning; finish reasons."""

from __future__ import annotations

import json

import pytest

from openinfer.frontend.openai.chat_output import ChatOutput, MessageDelta
from openinfer.frontend.openai.chat_tools import ChatTools, NamedToolChoice, ToolChoice
from openinfer.frontend.openai.parsers.qwen3_reasoning import Qwen3ReasoningParser

TOOLS = [{"type": "function", "function": {"name": name}} for name in ("get_weather", "get_time")]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TIME_CALL = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
THOUGHT = "<think>\nWeather, then time.\n</think>\n\n"
WEATHER = ("get_weather", {"city": "Paris"})


def output(choice: ToolChoice | None = "auto", reasoning: bool = True, **kwargs: bool) -> ChatOutput:
    tools = None if choice is None else ChatTools(TOOLS, choice, kwargs.pop("parallel", True))
    return ChatOutput(
        Qwen3ReasoningParser() if reasoning else None, tools, reasoning_fields=reasoning, **kwargs
    )


def read(chat: ChatOutput, pieces: list[str]) -> tuple[str, str, list[tuple[str, object]]]:
    """(reasoning, content, calls) of the pieces fed in order, then finish."""
    total = MessageDelta()
    for piece in pieces:
        total += chat.feed(piece)
    total += chat.finish()
    return total.reasoning, total.content, [(c.name, json.loads(c.arguments)) for c in total.tool_calls]


CASES = [
    # (choice, reasoning parser on, output, reasoning, content, calls)
    ("auto", True, f"{THOUGHT}{CALL}\n{TIME_CALL}", "\nWeather, then time.\n", "", [WEATHER, ("get_time", {})]),
    ("auto", True, f"{THOUGHT}It is sunny.", "\nWeather, then time.\n", "\n\nIt is sunny.", []),
    ("auto", True, f"<think>\nhm{CALL}", "\nhm", "", [WEATHER]),  # a call ends the reasoning
    ("auto", True, "<think>\nstill thinking", "\nstill thinking", "", []),  # cut by max_tokens
    ("auto", False, f"{THOUGHT}{CALL}", "", THOUGHT, [WEATHER]),  # no reasoning parser: content
    ("none", True, f"{THOUGHT}{CALL}", "\nWeather, then time.\n", f"\n\n{CALL}", []),  # not parsed
    (None, False, f"{THOUGHT}{CALL}", "", f"{THOUGHT}{CALL}", []),  # no parser at all: untouched
    (NamedToolChoice("get_weather"), True, f'{THOUGHT}{{"city": "Paris"}}', "\nWeather, then time.\n", "", [WEATHER]),
    (NamedToolChoice("get_weather"), True, f"{THOUGHT}{CALL}", "\nWeather, then time.\n", "", [WEATHER]),
    (NamedToolChoice("get_weather"), True, f"{THOUGHT}no call", "\nWeather, then time.\n", "\n\nno call", []),
    ("required", False, '[{"name": "get_time", "parameters": {}}]', "", "", [("get_time", {})]),
    ("required", False, f"{CALL}{TIME_CALL}", "", "", [WEATHER, ("get_time", {})]),  # read as "auto"
    ("required", False, '[{"name": "get_time"', "", '[{"name": "get_time"', []),
]  # fmt: skip


@pytest.mark.parametrize(("choice", "reasoning", "text", "thought", "content", "calls"), CASES)
def test_the_same_message_streamed_cut_anywhere_or_whole(
    choice: ToolChoice | None, reasoning: bool, text: str, thought: str, content: str, calls: list[object]
) -> None:
    """Whole, cut in two anywhere, character by character: the same reasoning, content and calls."""
    assert read(output(choice, reasoning), [text]) == (thought, content, calls)
    for cut in range(len(text) + 1):
        assert read(output(choice, reasoning), [text[:cut], text[cut:]]) == (thought, content, calls), cut
    assert read(output(choice, reasoning), list(text)) == (thought, content, calls)


def test_auto_releases_each_call_as_it_completes_forced_choices_at_the_end() -> None:
    """ "auto" streams reasoning, content and each call as soon as they are known; "required" and a named
    function hold the content (they read it in their forced form) until finish."""
    auto = output("auto")
    assert auto.feed(THOUGHT + CALL[:20]).reasoning == "\nWeather, then time.\n"
    assert [c.name for c in auto.feed(CALL[20:] + "\n").tool_calls] == ["get_weather"]
    forced = output("required")
    assert forced.feed(THOUGHT + CALL) == MessageDelta("\nWeather, then time.\n")
    assert [c.name for c in forced.finish().tool_calls] == ["get_weather"]


def test_parallel_tool_calls_false_keeps_the_first_call() -> None:
    """parallel_tool_calls false: the calls after the first are dropped (vLLM keeps the first)."""
    chat = output("auto", parallel=False)
    assert read(chat, [CALL, TIME_CALL, CALL]) == ("", "", [WEATHER])
    assert chat.num_tool_calls == 1


def test_include_reasoning_false_drops_the_reasoning() -> None:
    """vLLM's include_reasoning false: the reasoning is parsed out of the content and dropped."""
    assert read(output("auto", include_reasoning=False), [THOUGHT + "Hi"]) == ("", "\n\nHi", [])


@pytest.mark.parametrize(
    ("choice", "text", "engine", "finish"),
    [("auto", CALL, "stop", "tool_calls"), ("auto", CALL, "length", "length"), ("auto", "hi", "stop", "stop"),
     ("required", CALL, "stop", "tool_calls"), (NamedToolChoice("get_weather"), CALL, "stop", "stop"),
     ("none", CALL, "stop", "stop")],
)  # fmt: skip
def test_finish_reason(choice: ToolChoice, text: str, engine: str, finish: str) -> None:
    """ "tool_calls" where calls ended the output; a named choice says "stop" (OpenAI's and vLLM's); a
    length cut stays "length"."""
    chat = output(choice)
    read(chat, [text])
    assert chat.finish_reason(engine) == finish


def test_what_the_message_shows() -> None:
    """reasoning_content fields with the reasoning parser; null content whenever a parser reads."""
    assert (output(None, reasoning=False).parses, output(None, reasoning=False).reasoning_fields) == (
        False,
        False,
    )
    assert (output("none", reasoning=False).parses, output("auto", reasoning=False).parses) == (False, True)
    assert (output(None).parses, output(None).reasoning_fields) == (True, True)
