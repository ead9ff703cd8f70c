"""A ``POST /v1/chat/completions`` body, validated; its messages become a prompt through the chat template."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from openinfer.frontend.engines.registry import ServedModel
from openinfer.frontend.openai.chat_template import ChatTemplateError, compile_chat_template
from openinfer.frontend.openai.errors import ApiError, invalid_request
from openinfer.frontend.openai.request_body import decode_body, refuse_unsupported
from openinfer.frontend.openai.sampling_options import (
    TYPE_MESSAGES,
    UNSUPPORTED,
    SamplingBody,
    SamplingOptions,
    check_logprobs_count,
)
from openinfer.protocol import EngineCoreRequest

_NO_TOOLS = "tool calling is not supported by openinfer: send no `tools` / `functions`"
_MESSAGES = "`messages` must be a non-empty list of messages"

# Chat's own parameters openinfer does not honour, with the values that mean "not used" and what to say
# otherwise; those both endpoints refuse are in UNSUPPORTED.
_UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    **UNSUPPORTED,
    "tools": ((None, []), _NO_TOOLS),
    "functions": ((None, []), _NO_TOOLS),
    "tool_choice": ((None, "none", "auto"), _NO_TOOLS),
    "function_call": ((None, "none", "auto"), _NO_TOOLS),
    "response_format": ((None, {"type": "text"}), "`response_format` other than text is not supported"),
    "continue_final_message": ((None, False), "`continue_final_message` is not supported by openinfer"),
    "chat_template": ((None,), "a per-request `chat_template` is not supported: the model's own is used"),
    "modalities": ((None, ["text"]), 'openinfer serves text only: `modalities` must be ["text"]'),
}


class ChatBody(SamplingBody):
    """The JSON body of ``POST /v1/chat/completions``; null means the default, as absent does."""

    # Each an object with a string "role"; its other keys (content, name, ...) reach the template as given.
    messages: list[dict[str, Any]] | None = None
    max_completion_tokens: int | None = None  # OpenAI's current name, wins over max_tokens; default: no bound
    max_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None  # needs logprobs: true
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool | None = None  # default true
    # Refused unless neutral (_UNSUPPORTED)
    tools: Any = None
    functions: Any = None
    tool_choice: Any = None
    function_call: Any = None
    response_format: Any = None
    continue_final_message: Any = None
    chat_template: Any = None
    modalities: Any = None


@dataclass(frozen=True)
class ChatRequest:
    """What one chat completion asks for: messages (content as text), a model and the sampling options."""

    messages: list[dict[str, Any]]  # each with a string "role" and string "content", other keys as given
    model: str | None  # None: the first served model
    options: SamplingOptions
    add_generation_prompt: bool  # vLLM extension, default true: end the prompt with the assistant's turn
    template_kwargs: dict[str, Any]  # vLLM's chat_template_kwargs, e.g. {"enable_thinking": false}

    def to_engine_request(self, model: ServedModel, request_id: str) -> EngineCoreRequest:
        """Render the model's chat template (special tokens come from it, none are added) and tokenize."""
        source = model.tokenizer.chat_template
        if source is None:
            raise invalid_request(
                f"the model `{model.name}` has no chat template (no `chat_template` in its "
                "tokenizer_config.json and no chat_template.jinja), so it cannot take chat messages: use "
                "/v1/completions with a prompt",
                param="messages",
            )
        try:
            template = compile_chat_template(source)
        except ChatTemplateError as e:
            raise ApiError(
                500,
                f"{e}; fix the model's chat template (tokenizer_config.json or chat_template.jinja)",
                type_="server_error",
            ) from None
        try:
            prompt = template.render(
                self.messages,
                model.tokenizer.special_tokens,
                self.add_generation_prompt,
                self.template_kwargs,
            )
        except ChatTemplateError as e:
            raise invalid_request(str(e), param="messages") from None
        prompt_token_ids = model.tokenizer.encode(prompt, add_special_tokens=False)
        if not prompt_token_ids:
            raise invalid_request("the chat template made an empty prompt of these messages", "messages")
        return self.options.engine_request(model, prompt_token_ids, request_id, prompt_param="messages")


def parse_chat_request(body: bytes) -> ChatRequest:
    """Decode and validate a request body; raise :class:`ApiError` (400) naming the bad parameter."""
    chat = decode_body(body, ChatBody, TYPE_MESSAGES)
    refuse_unsupported(chat, _UNSUPPORTED)
    logprobs = bool(chat.logprobs)
    top_logprobs = check_logprobs_count(chat.top_logprobs, "top_logprobs")
    if top_logprobs is not None and not logprobs:
        raise invalid_request("`top_logprobs` needs `logprobs: true`", param="top_logprobs")
    if chat.max_completion_tokens is not None:
        bound, max_tokens = "max_completion_tokens", chat.max_completion_tokens
    else:
        bound, max_tokens = "max_tokens", chat.max_tokens
    options = SamplingOptions.from_body(
        chat, bound, max_tokens, logprobs=(top_logprobs or 0) if logprobs else None
    )
    return ChatRequest(
        messages=_messages(chat.messages),
        model=chat.model,
        options=options,
        add_generation_prompt=chat.add_generation_prompt is not False,
        template_kwargs=chat.chat_template_kwargs or {},
    )


def _messages(value: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """At least one message, each with a string role and text content."""
    if not value:
        raise invalid_request(_MESSAGES, param="messages")
    messages = []
    for i, message in enumerate(value):
        if not isinstance(message.get("role"), str):
            raise invalid_request(f"`messages[{i}]` must be an object with a string `role`", "messages")
        messages.append({**message, "content": _text_content(message.get("content"), i)})
    return messages


def _text_content(content: object, index: int) -> str:
    """A message's content as text: a string, null (""), or text parts joined by newlines (as vLLM)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise invalid_request(
                    f"`messages[{index}].content` holds a {kind!r} part; openinfer serves text-only "
                    'models and takes parts of type "text" with a string `text`',
                    param="messages",
                )
            texts.append(part["text"])
        return "\n".join(texts)
    raise invalid_request(
        f"`messages[{index}].content` must be a string or a list of text parts", param="messages"
    )
