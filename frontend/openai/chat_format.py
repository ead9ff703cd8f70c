"""OpenAI's chat completion objects ("chat.completion" and "chat.completion.chunk"), with chat logprobs."""

from __future__ import annotations

from typing import Any

from openinfer.frontend.openai.completion_delta import CompletionDelta, Usage
from openinfer.frontend.openai.response_format import FormatContext, clamp_logprob, joined_logprobs
from openinfer.protocol import TokenLogprobs


class ChatFormat:
    """The :class:`ResponseFormat` of /v1/chat/completions.

    A stream opens with a chunk holding ``delta.role`` (sent with the first tokens, as vLLM does, so that a
    client's time to first chunk is its time to first token), then ``delta.content`` chunks; the last
    carries ``finish_reason``.
    """

    def __init__(self, context: FormatContext) -> None:
        self._context = context
        self._first = True

    def response(self, deltas: list[CompletionDelta], usage: Usage) -> dict[str, Any]:
        last = deltas[-1]
        logprobs = joined_logprobs(deltas)
        token_ids = [t for d in deltas for t in d.token_ids]
        message = {"role": "assistant", "content": "".join(d.text for d in deltas)}
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
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            chunks.append(self._context.ids.envelope("chat.completion.chunk", [role]))
            if self._context.return_token_ids:
                chunks[0]["prompt_token_ids"] = self._context.prompt_token_ids
        if (
            delta.text
            or delta.finish_reason
            or delta.logprobs
            or (self._context.return_token_ids and delta.token_ids)
        ):
            content = {"content": delta.text} if delta.text else {}
            choice = self._choice("delta", content, delta.token_ids, delta.logprobs, delta)
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
        choice: dict[str, Any] = {
            "index": 0,
            key: message,
            "logprobs": None if logprobs is None else {"content": self._logprobs(token_ids, logprobs)},
            "finish_reason": delta.finish_reason,
            "stop_reason": delta.stop_reason,
        }
        if self._context.return_token_ids:
            choice["token_ids"] = token_ids
        return choice

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
