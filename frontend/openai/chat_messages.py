"""A chat request's ``messages``, validated into what the chat template renders: text content, assistant
``tool_calls`` with their arguments as objects (as transformers' templates and vLLM expect them), and
``role: "tool"`` results with the id of the call they answer."""

from __future__ import annotations

from typing import Any

from openinfer.frontend.openai.errors import invalid_request
from openinfer.frontend.openai.parsers.tool_call import load_json

_MESSAGES = "`messages` must be a non-empty list of messages"
# Content part types of OpenAI's chat and Responses APIs (and vLLM's) that carry media, with what they carry.
_MEDIA_PARTS = {
    "image_url": "an image",
    "input_image": "an image",
    "image": "an image",
    "video_url": "a video",
    "input_video": "a video",
    "video": "a video",
    "input_audio": "an audio",
    "audio_url": "an audio",
    "audio": "an audio",
    "file": "a file",
    "input_file": "a file",
}


def template_messages(value: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """At least one message, each with a string role and text content; 400 naming ``messages`` otherwise.

    Other keys reach the template as given; an assistant's ``reasoning`` (vLLM's name) is also its
    ``reasoning_content`` (the name Qwen3's template reads).
    """
    if not value:
        raise invalid_request(_MESSAGES, param="messages")
    messages = []
    for i, message in enumerate(value):
        role = message.get("role")
        if not isinstance(role, str):
            raise invalid_request(f"`messages[{i}]` must be an object with a string `role`", "messages")
        rendered = {**message, "content": _text_content(message.get("content"), i)}
        if role == "assistant":
            _assistant_fields(rendered, i)
        elif role == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise invalid_request(
                f"Missing required parameter: 'messages[{i}].tool_call_id' (a string: the id of the tool "
                "call this message answers).",
                param="messages",
            )
        messages.append(rendered)
    return messages


def _assistant_fields(message: dict[str, Any], index: int) -> None:
    reasoning = message.get("reasoning")
    if isinstance(reasoning, str) and message.get("reasoning_content") is None:
        message["reasoning_content"] = reasoning
    calls = message.get("tool_calls")
    if calls is None:
        message.pop("tool_calls", None)  # null is as good as absent, also to the template
        return
    if not isinstance(calls, list):
        raise invalid_request(f"`messages[{index}].tool_calls` must be a list of tool calls", "messages")
    message["tool_calls"] = [
        _tool_call(call, f"messages[{index}].tool_calls[{j}]") for j, call in enumerate(calls)
    ]


def _tool_call(call: object, path: str) -> dict[str, Any]:
    """``{"id", "type": "function", "function": {"name", "arguments": JSON text}}``, its arguments
    parsed into an object for the template (empty or absent: ``{}``, as vLLM)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(call, dict) or not isinstance(function, dict):
        raise invalid_request(f"`{path}` must be an object with a `function` object", param="messages")
    if not isinstance(function.get("name"), str):
        raise invalid_request(f"`{path}.function.name` must be a string", param="messages")
    arguments = function.get("arguments")
    if isinstance(arguments, str) and arguments.strip():
        arguments = load_json(arguments)
        if not isinstance(arguments, dict):
            raise invalid_request(
                f"`{path}.function.arguments` must be the JSON text of an object", param="messages"
            )
    elif not arguments:
        arguments = {}
    elif not isinstance(arguments, dict):
        raise invalid_request(f"`{path}.function.arguments` must be the JSON text of an object", "messages")
    return {**call, "function": {**function, "arguments": arguments}}


def _text_content(content: object, index: int) -> str:
    """A message's content as text: a string, null (""), or text parts joined by newlines (as vLLM)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
                continue
            kind = part.get("type") if isinstance(part, dict) else None
            where = f"`messages[{index}].content[{j}]`"
            media = _MEDIA_PARTS.get(kind) if isinstance(kind, str) else None
            if media is not None:
                raise invalid_request(
                    f"{where} is {media} part ({kind!r}): this server serves text only and takes no image, "
                    'video or audio input; send the message\'s content as a string or parts of type "text"',
                    param="messages",
                )
            raise invalid_request(
                f'{where} must be a part of type "text" with a string `text`, got '
                f"{kind if isinstance(kind, str) else type(part).__name__!r}",
                param="messages",
            )
        return "\n".join(texts)
    raise invalid_request(
        f"`messages[{index}].content` must be a string or a list of text parts", param="messages"
    )
