"""``--reasoning-parser qwen3``: the text a Qwen3 model thinks in ``<think>...</think>``, apart from its answer.

vLLM 0.32's qwen3 parser is the model: with thinking on (the default), output is reasoning until
``</think>``, whether or not the model wrote ``<think>`` first (a ``<think>`` is dropped, a later ``</think>``
too), so an unfinished think block is all reasoning; ``<tool_call>`` also ends the reasoning (and stays in
the content, for the tool parser). ``chat_template_kwargs.enable_thinking`` false leaves the output
untouched. One refinement: where the prompt's assistant turn already closed the think block (a template
that writes ``<think>\\n\\n</think>`` itself), the output is content from the start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from openinfer.frontend.openai.parsers.tag_scanner import Tag, TagScanner
from openinfer.frontend.tokenizer import Tokenizer

THINK_START = "<think>"
THINK_END = "</think>"
TOOL_CALL_START = "<tool_call>"
# ChatML's turn markers: the prompt's own assistant turn starts after the last one.
_TURN_BOUNDARIES = ("<|im_start|>", "<|im_end|>")


@dataclass(frozen=True)
class ReasoningSplit:
    """What some output text holds: its reasoning, then its content (reasoning never follows content)."""

    reasoning: str = ""
    content: str = ""


class Qwen3ReasoningParser:
    """Splits one completion's text, as it streams, into reasoning and content."""

    def __init__(self, in_reasoning: bool = True) -> None:
        self._in_reasoning = in_reasoning
        self._scanner = TagScanner((THINK_START, THINK_END, TOOL_CALL_START))

    @classmethod
    def for_prompt(
        cls, tokenizer: Tokenizer, prompt_token_ids: Sequence[int], template_kwargs: Mapping[str, Any]
    ) -> Qwen3ReasoningParser | None:
        """The parser for a completion of this prompt; None when thinking is off (``enable_thinking``
        false, as vLLM: the output is all content, untouched)."""
        if not template_kwargs.get("enable_thinking", True):
            return None
        return cls(in_reasoning=_prompt_leaves_reasoning_open(tokenizer, prompt_token_ids))

    @property
    def in_reasoning(self) -> bool:
        """Whether the text fed so far leaves the output in reasoning (before any: what the prompt says)."""
        return self._in_reasoning

    def feed(self, text: str) -> ReasoningSplit:
        """The reasoning and content ``text`` releases (the start of a tag may wait for the next text)."""
        return self._split(self._scanner.feed(text))

    def finish(self) -> ReasoningSplit:
        """What is held at the end of the output (an unfinished tag is text of the part it is in)."""
        return self._split(self._scanner.finish())

    def _split(self, pieces: list[str | Tag]) -> ReasoningSplit:
        reasoning: list[str] = []
        content: list[str] = []
        for piece in pieces:
            if isinstance(piece, str):
                (reasoning if self._in_reasoning else content).append(piece)
            elif piece.text == THINK_END:
                self._in_reasoning = False  # a second </think> is dropped, as vLLM's
            elif piece.text == TOOL_CALL_START:
                self._in_reasoning = False
                content.append(piece.text)
            elif self._in_reasoning:
                pass  # <think> opens what is already reasoning
            else:
                content.append(piece.text)  # <think> after the reasoning ended is content, as vLLM's
        return ReasoningSplit("".join(reasoning), "".join(content))


def _prompt_leaves_reasoning_open(tokenizer: Tokenizer, prompt_token_ids: Sequence[int]) -> bool:
    """Whether the output starts in reasoning: the prompt's last turn closed the think block with
    ``</think>`` (no), opened it with ``<think>`` (yes), or neither (yes: Qwen3's generation prompt leaves
    the model to open it). Read back to the last turn boundary, by token id, as vLLM's is_reasoning_end."""
    think_start, think_end = tokenizer.token_id(THINK_START), tokenizer.token_id(THINK_END)
    boundaries = {tokenizer.token_id(marker) for marker in _TURN_BOUNDARIES} - {None}
    for token_id in reversed(prompt_token_ids):
        if token_id == think_end:
            return False
        if token_id == think_start or token_id in boundaries:
            return True
    return True
