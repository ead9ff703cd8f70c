"""OpenAI's chat completion objects ("chat.completion" and "chat.completion.chunk"), with chat logprobs,
reasoning and tool calls."""

from __future__ import annotations

from typing import Any

from openinfer.frontend.openai.chat_output import ChatOutput, MessageDelta
from openinfer.frontend.openai.completion_delta import CompletionDelta, Usage
from openinfer.frontend.openai.response_format import FormatContext, clamp_logprob, joined_logprobs
from openinfer.protocol import TokenLogprobs


class ChatFormat:
    """The :class:`ResponseFormat` of /v1/chat/completions.

    A stream opens with a chunk holding ``delta.role`` (sent with the first tokens, as vLLM does, so that a
    client's time to first chunk is its time to first token), then chunks of ``delta.reasoning_content``
    (also as ``delta.reasoning``, vLLM's name) and ``delta.content``; each tool call is two chunks, the
    first with its index, id, type and name (arguments ""), the second with its arguments. The last chunk
    of an output carries its logprobs and token ids, and the last of all ``finish_reason``.
    """

    def __init__(self, context: FormatContext, output: ChatOutput) -> None:
        self._context = context
        self._output = output
        self._first = True

    def response(self, deltas: list[CompletionDelta], usage: Usage) -> dict[str, Any]:
        last = deltas[-1]
        logprobs = joined_logprobs(deltas)
        token_ids = [t for d in deltas for t in d.token_ids]
        parsed = self._output.feed("".join(d.text for d in deltas)) + self._output.finish()
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content or self._no_content()}
        if self._output.reasoning_fields:
            message["reasoning_content"] = message["reasoning"] = parsed.reasoning or None
        if parsed.tool_calls:
            message["tool_calls"] = [call.to_json() for call in parsed.tool_calls]
        choice = self._choice("message", message, token_ids, logprobs, last)
        body = self._context.ids.envelope("chat.completion", [choice])
        if self._context.return_token_ids:
            body["prompt_token_ids"] = self._context.prompt_token_ids
        return self._context.extras.finish_body(body, last, usage)

    def chunks(self, delta: CompletionDelta) -> list[dict[str, Any]]:
        chunks = []
        if self._first:
            self._first = False
            role = {
                "index": self._context.index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            chunks.append(self._context.ids.envelope("chat.completion.chunk", [role]))
            if self._context.return_token_ids:
                chunks[0]["prompt_token_ids"] = self._context.prompt_token_ids
        parsed = self._output.feed(delta.text)
        if delta.finish_reason is not None:
            parsed += self._output.finish()
        *earlier, last = self._delta_messages(parsed)
        for message in earlier:
            choice = {
                "index": self._context.index,
                "delta": message,
                "logprobs": None,
                "finish_reason": None,
                "stop_reason": None,
            }
            chunks.append(self._context.ids.envelope("chat.completion.chunk", [choice]))
        if (
            last
            or delta.finish_reason
            or delta.logprobs
            or (self._context.return_token_ids and delta.token_ids)
        ):
            choice = self._choice("delta", last, delta.token_ids, delta.logprobs, delta)
            chunks.append(self._context.ids.envelope("chat.completion.chunk", [choice]))
        return self._context.extras.finish_chunks(chunks, delta)

    def usage_chunk(self, usage: Usage) -> dict[str, Any] | None:
        return self._context.extras.usage_chunk(
            self._context.ids.envelope("chat.completion.chunk", []), usage
        )

    def _choice(
        self,
        key: str,
        message: dict[str, Any],
        token_ids: list[int],
        logprobs: list[TokenLogprobs] | None,
        delta: CompletionDelta,
    ) -> dict[str, Any]:
        finish_reason = None
        if delta.finish_reason is not None:
            finish_reason = self._output.finish_reason(delta.finish_reason)
        choice: dict[str, Any] = {
            "index": self._context.index,
            key: message,
            "logprobs": None if logprobs is None else {"content": self._logprobs(token_ids, logprobs)},
            "finish_reason": finish_reason,
            "stop_reason": delta.stop_reason,
        }
        if self._context.return_token_ids:
            choice["token_ids"] = token_ids
        return choice

    def _no_content(self) -> str | None:
        """A message without content: "" as ever, or null (vLLM's) where a parser read the output."""
        return None if self._output.parses else ""

    def _delta_messages(self, parsed: MessageDelta) -> list[dict[str, Any]]:
        """The stream deltas of what an output released: its text, then two per tool call (at least one
        delta, maybe empty)."""
        text: dict[str, Any] = {}
        if parsed.reasoning:
            text["reasoning_content"] = text["reasoning"] = parsed.reasoning
        if parsed.content:
            text["content"] = parsed.content
        messages = [text] if text or not parsed.tool_calls else []
        first_index = self._output.num_tool_calls - len(parsed.tool_calls)
        for index, call in enumerate(parsed.tool_calls, start=first_index):
            head = {
                "index": index,
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            messages.append({"tool_calls": [head]})
            messages.append({"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]})
        return messages

    def _logprobs(self, token_ids: list[int], logprobs: list[TokenLogprobs]) -> list[dict[str, Any]]:
        """Chat logprobs: per token its text, logprob and bytes, and the top_logprobs most likely tokens."""
        return [
            {
                **self._token(token_id, entry.logprob),
                "top_logprobs": [
                    self._token(top_id, top_logprob)
                    for top_id, top_logprob in zip(entry.top_token_ids, entry.top_logprobs, strict=True)
                ],
            }
            for token_id, entry in zip(token_ids, logprobs, strict=True)
        ]

    def _token(self, token_id: int, logprob: float) -> dict[str, Any]:
        return {
            "token": self._context.tokenizer.token_text(token_id),
            "logprob": clamp_logprob(logprob),
            "bytes": list(self._context.tokenizer.token_bytes(token_id)),
        }
