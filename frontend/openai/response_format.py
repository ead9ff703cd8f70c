"""How an OpenAI endpoint shapes a generation into response bodies and stream chunks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from openinfer.frontend.metrics.spec_decode.per_request import PerRequestSpecMetrics
from openinfer.frontend.openai.completion_delta import CompletionDelta, Usage
from openinfer.frontend.tokenizer import Tokenizer
from openinfer.protocol import TokenLogprobs

# JSON has no -inf: a token the model rules out entirely is reported with this logprob (as vLLM does).
MIN_LOGPROB = -9999.0


class ResponseFormat(Protocol):
    """One endpoint's shapes for one choice of a request: /v1/completions or /v1/chat/completions.

    What it returns is finished: usage and spec-decode metrics included, nothing changes it after. Formats
    keep state across a stream (chat's role chunk goes first, completions' logprob text offsets run on), so
    use a new one per choice.
    """

    def response(self, deltas: list[CompletionDelta], usage: Usage) -> dict[str, Any]:
        """The whole response to a non-streamed request, holding this one choice (``usage``: the request's)."""
        ...

    def chunks(self, delta: CompletionDelta) -> list[dict[str, Any]]:
        """The stream chunks one delta makes, possibly none (text held back, nothing else to say)."""
        ...

    def usage_chunk(self, usage: Usage) -> dict[str, Any] | None:
        """The chunk with no choices for ``stream_options.include_usage``; None when it was not asked for."""
        ...


@dataclass(frozen=True)
class ResponseExtras:
    """What the last body or chunk of every endpoint carries beyond its shape: usage and spec metrics."""

    include_usage: bool  # streams: every chunk has "usage" (None), the final usage chunk fills it
    spec_metrics: PerRequestSpecMetrics  # what the final response or chunk tells of speculative decoding
    # n > 1: each choice carries its own "metrics" (its finishing choice in a stream); else the body does
    metrics_per_choice: bool = False

    def finish_body(self, body: dict[str, Any], last: CompletionDelta, usage: Usage) -> dict[str, Any]:
        """A whole response: with its usage, and its metrics if it has any."""
        body["usage"] = usage.to_json()
        self._add_metrics(body, last)
        return body

    def finish_chunks(self, chunks: list[dict[str, Any]], delta: CompletionDelta) -> list[dict[str, Any]]:
        """One delta's chunks: the metrics on the one with finish_reason (the last); usage None on each if
        asked."""
        if chunks and delta.finish_reason is not None:
            self._add_metrics(chunks[-1], delta)
        if self.include_usage:
            for chunk in chunks:
                chunk["usage"] = None  # as OpenAI: every chunk has it, only the last one fills it
        return chunks

    def usage_chunk(self, envelope: dict[str, Any], usage: Usage) -> dict[str, Any] | None:
        if not self.include_usage:
            return None
        envelope["usage"] = usage.to_json()
        return envelope

    def _add_metrics(self, body: dict[str, Any], delta: CompletionDelta) -> None:
        """``body``'s metrics: its own, or, per choice, its one choice's."""
        metrics = self.spec_metrics.response_metrics(delta.spec_stats)
        if metrics is not None:
            [choice] = body["choices"] if self.metrics_per_choice else [body]
            choice["metrics"] = metrics


@dataclass(frozen=True)
class ResponseIds:
    """What every body and chunk of one response repeats."""

    id: str  # "cmpl-..." or "chatcmpl-...": the request id with the endpoint's prefix
    created: int  # unix seconds
    model: str

    def envelope(self, object_type: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": object_type,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }


@dataclass(frozen=True)
class FormatContext:
    """What a format needs of its request besides the deltas."""

    ids: ResponseIds
    tokenizer: Tokenizer
    prompt_token_ids: list[int]
    return_token_ids: bool  # vLLM extension: prompt and output token ids in the choices
    extras: ResponseExtras
    index: int = 0  # the choice's, in [0, n)


def clamp_logprob(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def joined_logprobs(deltas: list[CompletionDelta]) -> list[TokenLogprobs] | None:
    """All deltas' logprobs in order, or None when the request asked for none."""
    if all(delta.logprobs is None for delta in deltas):
        return None
    return [entry for delta in deltas for entry in delta.logprobs or []]
