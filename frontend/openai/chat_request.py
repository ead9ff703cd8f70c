"""A ``POST /v1/chat/completions`` body, validated; its messages become a prompt through the chat template."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar

from openinfer.frontend.engines.registry import ServedModel
from openinfer.frontend.openai.body.decode import Int64, decode_body, refuse_unsupported
from openinfer.frontend.openai.chat_format import ChatFormat
from openinfer.frontend.openai.chat_messages import template_messages
from openinfer.frontend.openai.chat_output import ChatOutput
from openinfer.frontend.openai.chat_tools import ChatTools, parse_chat_tools
from openinfer.frontend.openai.errors import invalid_request
from openinfer.frontend.openai.parsers.chat_parsers import ChatParsers
from openinfer.frontend.openai.parsers.qwen3_reasoning import THINK_END, Qwen3ReasoningParser
from openinfer.frontend.openai.prepared_request import PreparedRequest
from openinfer.frontend.openai.response_format import FormatContext
from openinfer.frontend.openai.sampling_options import (
    TYPE_MESSAGES,
    UNSUPPORTED,
    SamplingBody,
    SamplingOptions,
    check_logprobs_count,
)
from openinfer.frontend.openai.structured_constraint import StructuredConstraint
from openinfer.frontend.openai.structured_options import json_constraint, parse_structured
from openinfer.frontend.openai.structured_outputs_config import StructuredOutputsConfig
from openinfer.frontend.openai.template_pool import ChatTemplatePool
from openinfer.frontend.tokenizer import Tokenizer

_NO_FUNCTIONS = "the deprecated `functions` / `function_call` are not supported: send `tools` / `tool_choice`"

# Template parameters openinfer does not honour (chat and the chat form of /tokenize), with the values that
# mean "not used" and what to say otherwise.
TEMPLATE_UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "continue_final_message": ((None, False), "`continue_final_message` is not supported by openinfer"),
    "chat_template": ((None,), "a per-request `chat_template` is not supported: the model's own is used"),
}

# Chat's own parameters openinfer does not honour, with the values that mean "not used" and what to say
# otherwise; those both endpoints refuse are in UNSUPPORTED.
_UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    **UNSUPPORTED,
    "functions": ((None, []), _NO_FUNCTIONS),
    "function_call": ((None, "none", "auto"), _NO_FUNCTIONS),
    **TEMPLATE_UNSUPPORTED,
    "modalities": ((None, ["text"]), 'openinfer serves text only: `modalities` must be ["text"]'),
    # SGLang's, which sglang-router and vllm-router add to every chat they forward (at these defaults): the
    # reasoning parser's output is always apart and streamed as it comes
    "separate_reasoning": ((None, True), "`separate_reasoning: false` is not supported by openinfer"),
    "stream_reasoning": ((None, True), "`stream_reasoning: false` is not supported by openinfer"),
}


class ChatBody(SamplingBody, frozen=True):
    """The JSON body of ``POST /v1/chat/completions``; null means the default, as absent does."""

    # Each an object with a string "role"; its other keys (content, name, ...) reach the template as given.
    messages: list[dict[str, Any]] | None = None
    # OpenAI's current name, wins over max_tokens; default: no bound
    max_completion_tokens: Int64 | None = None
    max_tokens: Int64 | None = None
    logprobs: bool | None = None
    top_logprobs: Int64 | None = None  # needs logprobs: true
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool | None = None  # default true
    include_reasoning: bool | None = None  # vLLM extension, default true: false drops reasoning_content
    # Checked by parse_chat_tools, which names the bad part (tools[0].function.name, ...)
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    # Refused unless neutral (_UNSUPPORTED)
    functions: Any = None
    function_call: Any = None
    continue_final_message: Any = None
    chat_template: Any = None
    modalities: Any = None
    separate_reasoning: Any = None
    stream_reasoning: Any = None


@dataclass(frozen=True)
class ChatRequest:
    """What one chat completion asks for: messages (content as text), a model, the sampling options, the
    tools, and how the output is read."""

    messages: list[dict[str, Any]]  # each with a string "role" and string "content", other keys as given
    model: str | None  # None: the first served model
    options: SamplingOptions
    add_generation_prompt: bool  # vLLM extension, default true: end the prompt with the assistant's turn
    template_kwargs: dict[str, Any]  # vLLM's chat_template_kwargs, e.g. {"enable_thinking": false}
    tools: ChatTools
    parsers: ChatParsers  # the server's
    include_reasoning: bool  # vLLM extension, default true

    response_prefix: ClassVar[str] = "chatcmpl"  # of its response id, as vLLM's

    async def render(self, model: ServedModel, templates: ChatTemplatePool) -> str:
        """The prompt ``model``'s chat template makes of the messages, rendered in a worker process."""
        return await templates.render(
            model, self.messages, self.add_generation_prompt, self.template_kwargs, self.tools.tools
        )

    def prepare(self, model: ServedModel, request_id: str, prompt: str) -> PreparedRequest:
        """Tokenize ``prompt``, what the model's chat template made of the messages
        (:meth:`render`; special tokens come from it, none are added); the prompt says
        whether the output opens in reasoning, which places the constraint and starts each choice's
        reasoning parser."""
        self.options.check_before_tokenizing(model, prompt, "messages")
        prompt_token_ids = model.tokenizer.encode(prompt, add_special_tokens=False)
        if not prompt_token_ids:
            raise invalid_request("the chat template made an empty prompt of these messages", "messages")
        reasoning = None
        if self.parsers.reasoning_parser is not None:
            reasoning = Qwen3ReasoningParser.for_prompt(
                model.tokenizer, prompt_token_ids, self.template_kwargs
            )
        start_after = None
        if self.options.structured is not None and reasoning is not None:
            start_after = _reasoning_end_token(model.tokenizer, reasoning)
        engine_request = self.options.engine_request(
            model, prompt_token_ids, request_id, prompt_param="messages", structured_start_after=start_after
        )
        in_reasoning = None if reasoning is None else reasoning.in_reasoning
        return PreparedRequest(engine_request, functools.partial(self._format, in_reasoning=in_reasoning))

    def _format(self, context: FormatContext, in_reasoning: bool | None) -> ChatFormat:
        """One choice's format, reading its output with a reasoning parser of its own (None: no reasoning
        split), which starts in reasoning where the prompt left it open."""
        reasoning = None if in_reasoning is None else Qwen3ReasoningParser(in_reasoning=in_reasoning)
        output = ChatOutput(
            reasoning,
            self.tools,
            reasoning_fields=self.parsers.reasoning_parser is not None,
            include_reasoning=self.include_reasoning,
        )
        return ChatFormat(context, output)


def _reasoning_end_token(tokenizer: Tokenizer, reasoning: Qwen3ReasoningParser) -> int | None:
    """``</think>``'s token id where the output starts in reasoning, which the constraint follows (as vLLM
    applies it once reasoning ends); None after a prompt that closed the think block, or where ``</think>``
    is not one token."""
    if not reasoning.in_reasoning:
        return None
    think_end = tokenizer.encode(THINK_END, add_special_tokens=False)
    return think_end[0] if len(think_end) == 1 else None


def parse_chat_request(
    body: bytes, parsers: ChatParsers | None = None, structured_config: StructuredOutputsConfig | None = None
) -> ChatRequest:
    """Decode and validate a request body; raise :class:`ApiError` (400) naming the bad parameter.

    ``parsers``: the server's output parsers, which decide what tool choices it takes (default: none);
    ``structured_config``: the server's structured-outputs settings, put on the request's constraint here
    (default: none)."""
    parsers = parsers or ChatParsers()
    chat = decode_body(body, ChatBody, TYPE_MESSAGES)
    refuse_unsupported(chat, _UNSUPPORTED)
    logprobs = bool(chat.logprobs)
    top_logprobs = check_logprobs_count(chat.top_logprobs, "top_logprobs")
    if top_logprobs is not None and not logprobs:
        raise invalid_request("`top_logprobs` needs `logprobs: true`", param="top_logprobs")
    max_tokens: int | None
    if chat.max_completion_tokens is not None:
        bound, max_tokens = "max_completion_tokens", chat.max_completion_tokens
    else:
        bound, max_tokens = "max_tokens", chat.max_tokens
    structured = parse_structured(chat.response_format, chat.structured_outputs)
    tools = parse_chat_tools(chat.tools, chat.tool_choice, chat.parallel_tool_calls, parsers)
    structured = (structured_config or StructuredOutputsConfig()).applied(
        _forced_call_constraint(tools, structured)
    )
    options = SamplingOptions.from_body(
        chat, bound, max_tokens, (top_logprobs or 0) if logprobs else None, structured
    )
    return ChatRequest(
        messages=template_messages(chat.messages),
        model=chat.model,
        options=options,
        add_generation_prompt=chat.add_generation_prompt is not False,
        template_kwargs=chat.chat_template_kwargs or {},
        tools=tools,
        parsers=parsers,
        include_reasoning=chat.include_reasoning is not False,
    )


def _forced_call_constraint(
    tools: ChatTools, structured: StructuredConstraint | None
) -> StructuredConstraint | None:
    """A named or "required" tool_choice is a JSON constraint (:meth:`ChatTools.output_schema`), so the call
    is certain; a request that also sets its own constraint is refused, as vLLM refuses it."""
    schema = tools.output_schema()
    if schema is None:
        return structured
    if structured is not None:
        raise invalid_request(
            "You can only either use constraints for structured outputs or tools, not both: a named or "
            '"required" tool_choice constrains the output to its call',
            param=structured.param,
        )
    return json_constraint(schema, param="tools")
