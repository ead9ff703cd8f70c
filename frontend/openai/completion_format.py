"""OpenAI's completion objects ("text_completion"), streamed or whole, with the legacy logprobs object."""

from __future__ import annotations

from typing import Any

from openinfer.frontend.openai.completion_delta import CompletionDelta, Usage
from openinfer.frontend.openai.response_format import FormatContext, clamp_logprob, joined_logprobs
from openinfer.protocol import TokenLogprobs

_OBJECT = "text_completion"


class CompletionFormat:
    """The :class:`ResponseFormat` of /v1/completions."""

    def __init__(self, context: FormatContext) -> None:
        self._context = context
        self._text_offset = 0  # where the next token's text starts, counted in token texts
        self._first = True

    def response(self, deltas: list[CompletionDelta], usage: Usage) -> dict[str, Any]:
        last = deltas[-1]
        token_ids = [t for d in deltas for t in d.token_ids]
        logprobs = joined_logprobs(deltas)
        choice = self._choice("".join(d.text for d in deltas), token_ids, logprobs, last)
        if self._context.return_token_ids:
            choice["prompt_token_ids"] = self._context.prompt_token_ids
        return self._context.extras.finish_body(self._context.ids.envelope(_OBJECT, [choice]), last, usage)

    def chunks(self, delta: CompletionDelta) -> list[dict[str, Any]]:
        if not (
            delta.text
            or delta.finish_reason
            or delta.logprobs
            or (self._context.return_token_ids and delta.token_ids)
        ):
            return []  # text held back until a character (or a possible stop string) completes
        choice = self._choice(delta.text, delta.token_ids, delta.logprobs, delta)
        if self._context.return_token_ids and self._first:
            choice["prompt_token_ids"] = self._context.prompt_token_ids
        self._first = False
        return self._context.extras.finish_chunks([self._context.ids.envelope(_OBJECT, [choice])], delta)

    def usage_chunk(self, usage: Usage) -> dict[str, Any] | None:
        return self._context.extras.usage_chunk(self._context.ids.envelope(_OBJECT, []), usage)

    def _choice(
        self, text: str, token_ids: list[int], logprobs: list[TokenLogprobs] | None, delta: CompletionDelta
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": self._context.index,
            "text": text,
            "logprobs": None if logprobs is None else self._logprobs(token_ids, logprobs),
            "finish_reason": delta.finish_reason,
            "stop_reason": delta.stop_reason,
        }
        if self._context.return_token_ids:
            choice["token_ids"] = token_ids
        return choice

    def _logprobs(self, token_ids: list[int], logprobs: list[TokenLogprobs]) -> dict[str, Any]:
        """OpenAI's legacy logprobs: per token its text, logprob, offset, and a dict of the top alternatives
        (token text -> logprob) that also holds the sampled token (so up to k + 1 entries, as vLLM)."""
        tokens = [self._context.tokenizer.token_text(t) for t in token_ids]
        offsets = []
        for token in tokens:
            offsets.append(self._text_offset)
            self._text_offset += len(token)
        top: list[dict[str, float]] = []
        for token, entry in zip(tokens, logprobs, strict=True):
            alternatives: dict[str, float] = {}
            for token_id, logprob in zip(entry.top_token_ids, entry.top_logprobs, strict=True):
                alternatives.setdefault(self._context.tokenizer.token_text(token_id), clamp_logprob(logprob))
            alternatives.setdefault(token, clamp_logprob(entry.logprob))
            top.append(alternatives)
        return {
            "tokens": tokens,
            "token_logprobs": [clamp_logprob(entry.logprob) for entry in logprobs],
            "top_logprobs": top,
            "text_offset": offsets,
        }
