"""The parsers a frontend runs on chat output: vLLM's ``--reasoning-parser``, ``--tool-call-parser`` and
``--enable-auto-tool-choice``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

ReasoningParserName = Literal["qwen3"]  # <think>...</think> (Qwen3, as vLLM's qwen3 parser)
ToolCallParserName = Literal["hermes"]  # <tool_call>{"name": ..., "arguments": ...}</tool_call> (Qwen3)
REASONING_PARSERS: tuple[str, ...] = get_args(ReasoningParserName)
TOOL_CALL_PARSERS: tuple[str, ...] = get_args(ToolCallParserName)


@dataclass(frozen=True)
class ChatParsers:
    """How the chat endpoint reads what models write; the defaults leave the output untouched."""

    reasoning_parser: ReasoningParserName | None = None  # splits reasoning_content from content
    tool_call_parser: ToolCallParserName | None = None  # needed by every tool_choice but "none"
    enable_auto_tool_choice: bool = False  # tool_choice "auto" (the default with tools) is allowed

    def __post_init__(self) -> None:
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(
                f"unknown reasoning parser {self.reasoning_parser!r}; openinfer has: "
                + ", ".join(REASONING_PARSERS)
            )
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ValueError(
                f"unknown tool call parser {self.tool_call_parser!r}; openinfer has: "
                + ", ".join(TOOL_CALL_PARSERS)
            )
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser (hermes for Qwen3)")


def add_chat_parser_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """vLLM's flags for reading chat output, on ``parser`` (openinfer-frontend's; openinfer-serve passes them
    on to its frontend): :func:`chat_parsers` reads them back."""
    parser.add_argument(
        "--reasoning-parser",
        type=_one_of("reasoning parser", REASONING_PARSERS),
        metavar="{" + ",".join(REASONING_PARSERS) + "}",
        help="chat: the text in <think>...</think> is message.reasoning_content (default: left in content)",
    )
    parser.add_argument(
        "--tool-call-parser",
        type=_one_of("tool call parser", TOOL_CALL_PARSERS),
        metavar="{" + ",".join(TOOL_CALL_PARSERS) + "}",
        help='chat: <tool_call> blocks are message.tool_calls; tool_choice "required" and named functions '
        "need it",
    )
    parser.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='chat: allow tool_choice "auto" (the default with tools), the model deciding; needs '
        "--tool-call-parser",
    )


def chat_parsers(args: argparse.Namespace) -> ChatParsers:
    """The parsers the flags name; ValueError (a clear message) for a combination that cannot work."""
    return ChatParsers(args.reasoning_parser, args.tool_call_parser, args.enable_auto_tool_choice)


def chat_parser_argv(parsers: ChatParsers) -> list[str]:
    """The flags that name ``parsers``, for a command line."""
    argv = []
    if parsers.reasoning_parser is not None:
        argv += ["--reasoning-parser", parsers.reasoning_parser]
    if parsers.tool_call_parser is not None:
        argv += ["--tool-call-parser", parsers.tool_call_parser]
    if parsers.enable_auto_tool_choice:
        argv.append("--enable-auto-tool-choice")
    return argv


def _one_of(kind: str, names: tuple[str, ...]) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value not in names:
            raise argparse.ArgumentTypeError(f"unknown {kind} {value!r}; openinfer has: {', '.join(names)}")
        return value

    return check
