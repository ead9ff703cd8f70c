"""``--tool-call-parser hermes``: the ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks Qwen3
(and Hermes-style models) write, parsed out of the content as it streams.

Each block becomes a call once it is complete: its ``</tool_call>`` arrived, or the output ended after a
body that parses (vLLM accepts a missing closing tag too). Its body must be a JSON object with a string
``name`` and an object ``arguments``; any other block (malformed JSON, cut short by max_tokens) stays in the
content as the model wrote it, tags and all. A stretch of text that is only whitespace and lies between calls,
or before the first or after the last (the newlines Qwen3 writes around its blocks), is dropped; all other
text is content, unchanged. A call is released whole, so a stream never carries part of a call that later
turns out malformed.
"""

from __future__ import annotations

from openinfer.frontend.openai.parsers.tag_scanner import Tag, TagScanner
from openinfer.frontend.openai.parsers.tool_call import ToolCall, load_json

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"


class HermesToolParser:
    """Content text in, content text and complete :class:`ToolCall` s out, in order."""

    def __init__(self) -> None:
        self._scanner = TagScanner((TOOL_CALL_START, TOOL_CALL_END))
        self._block: str | None = None  # the body of the open <tool_call> block, None outside one
        self._whitespace = ""  # the text since the last call (or the start) while it is only whitespace
        self._in_text = False  # that text holds more than whitespace (and was released)
        self._after_call = False  # that text follows a call

    def feed(self, text: str) -> list[str | ToolCall]:
        """What ``text`` releases: content text (never empty) and calls."""
        out: list[str | ToolCall] = []
        for piece in self._scanner.feed(text):
            self._take(piece, out)
        return out

    def finish(self) -> list[str | ToolCall]:
        """The end of the output: an open block is a call if its body parses, else content."""
        out: list[str | ToolCall] = []
        for piece in self._scanner.finish():
            self._take(piece, out)
        if self._block is not None:
            self._end_block(closed=False, out=out)
        if self._whitespace and not self._after_call:
            out.append(self._whitespace)  # an output of only whitespace, untouched
        self._whitespace = ""
        return out

    def _take(self, piece: str | Tag, out: list[str | ToolCall]) -> None:
        if self._block is None:
            if piece == Tag(TOOL_CALL_START):
                self._block = ""
            else:  # text, or a </tool_call> that closes nothing
                self._text(piece if isinstance(piece, str) else piece.text, out)
        elif isinstance(piece, str):
            self._block += piece
        else:
            self._end_block(closed=piece.text == TOOL_CALL_END, out=out)
            if piece.text == TOOL_CALL_START:  # a new block opens where the last one never closed
                self._block = ""

    def _end_block(self, closed: bool, out: list[str | ToolCall]) -> None:
        assert self._block is not None
        body, self._block = self._block, None
        call = parse_hermes_call(body)
        if call is None:
            self._text(TOOL_CALL_START + body + (TOOL_CALL_END if closed else ""), out)
            return
        self._whitespace = ""  # only whitespace since the last call or the start: dropped
        self._in_text, self._after_call = False, True
        out.append(call)

    def _text(self, text: str, out: list[str | ToolCall]) -> None:
        """Release content text; text that is only whitespace so far waits for what follows it."""
        if self._in_text:
            out.append(text)
        elif not text.strip():
            self._whitespace += text
        else:
            out.append(self._whitespace + text)
            self._whitespace, self._in_text = "", True


def parse_hermes_call(body: str) -> ToolCall | None:
    """The call a block's body holds, or None: ``{"name": "f", "arguments": {...}}``."""
    value = load_json(body)
    if not isinstance(value, dict):
        return None
    name, arguments = value.get("name"), value.get("arguments")
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    return ToolCall.of(name, arguments)
