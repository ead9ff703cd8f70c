"""One chat completion's text read by the server's parsers: reasoning, content and tool calls, streamed or
whole (the whole output is read the same way, in one piece, so both give the same message)."""

from __future__ import annotations

from dataclasses import dataclass

from openinfer.frontend.openai.chat_tools import ChatTools, NamedToolChoice
from openinfer.frontend.openai.parsers.hermes_tools import HermesToolParser
from openinfer.frontend.openai.parsers.qwen3_reasoning import Qwen3ReasoningParser, ReasoningSplit
from openinfer.frontend.openai.parsers.tool_call import ToolCall


@dataclass(frozen=True)
class MessageDelta:
    """What some output adds to the message: reasoning first, then content and calls."""

    reasoning: str = ""
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()

    def __add__(self, other: MessageDelta) -> MessageDelta:
        return MessageDelta(
            self.reasoning + other.reasoning, self.content + other.content, self.tool_calls + other.tool_calls
        )


class ChatOutput:
    """Reads one completion's text as it streams; :meth:`finish` at its end.

    ``reasoning``: the request's reasoning parser (None: no reasoning split). ``tools``: the request's
    tools (None, or tool_choice "none": the content is left as written). "auto" reads ``<tool_call>``
    blocks as they complete; "required" and a named function hold the content to the end, then read it in
    the forced form (:meth:`ChatTools.forced_calls`) or, failing that, as "auto" does.
    """

    def __init__(
        self,
        reasoning: Qwen3ReasoningParser | None,
        tools: ChatTools | None,
        *,
        reasoning_fields: bool,
        include_reasoning: bool = True,
    ) -> None:
        self._reasoning = reasoning
        self._tools = tools if tools is not None and tools.parses_calls else None
        self._hermes = HermesToolParser() if self._tools is not None else None
        self._forced = self._tools is not None and self._tools.choice not in ("auto", "none")
        self._held = ""  # the content a forced choice reads at the end
        self._include_reasoning = include_reasoning
        self.reasoning_fields = reasoning_fields  # the message has reasoning_content (and reasoning)
        self.num_tool_calls = 0

    @property
    def parses(self) -> bool:
        """Whether any parser reads this output (then empty content is null, as vLLM's)."""
        return self.reasoning_fields or self._tools is not None

    def feed(self, text: str) -> MessageDelta:
        """What ``text``, the output's next piece, adds (some of it may wait for more text)."""
        split = ReasoningSplit(content=text) if self._reasoning is None else self._reasoning.feed(text)
        return self._message(split, final=False)

    def finish(self) -> MessageDelta:
        """What the end of the output releases: held text, an open block, the forced choice's calls."""
        split = ReasoningSplit() if self._reasoning is None else self._reasoning.finish()
        return self._message(split, final=True)

    def finish_reason(self, engine_reason: str) -> str:
        """OpenAI's finish_reason: "tool_calls" where calls ended the output (a named choice says "stop",
        as OpenAI's and vLLM's); a length cut stays "length"."""
        named = self._tools is not None and isinstance(self._tools.choice, NamedToolChoice)
        if self.num_tool_calls and engine_reason == "stop" and not named:
            return "tool_calls"
        return engine_reason

    def _message(self, split: ReasoningSplit, final: bool) -> MessageDelta:
        reasoning = split.reasoning if self._include_reasoning else ""
        if self._hermes is None:
            return MessageDelta(reasoning, split.content)
        pieces: list[str | ToolCall] = []
        if not self._forced:
            pieces = self._hermes.feed(split.content) + (self._hermes.finish() if final else [])
        elif final:
            output, self._held = self._held + split.content, ""
            assert self._tools is not None
            forced = self._tools.forced_calls(output)
            pieces = [*forced] if forced is not None else self._hermes.feed(output) + self._hermes.finish()
        else:
            self._held += split.content
        content = "".join(piece for piece in pieces if isinstance(piece, str))
        return MessageDelta(reasoning, content, self._kept([p for p in pieces if isinstance(p, ToolCall)]))

    def _kept(self, calls: list[ToolCall]) -> tuple[ToolCall, ...]:
        """The calls kept: all, or only the first of the output with ``parallel_tool_calls`` false."""
        assert self._tools is not None
        if not self._tools.parallel_tool_calls:
            calls = calls[: max(0, 1 - self.num_tool_calls)]
        self.num_tool_calls += len(calls)
        return tuple(calls)
