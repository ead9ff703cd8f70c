"""How an OpenAI endpoint shapes a generation into response bodies and stream chunks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from openinfer.frontend.openai.generation import CompletionDelta
from openinfer.protocol import TokenLogprobs

# JSON has no -inf: a token the model rules out entirely is reported with this logprob (as vLLM does).
MIN_LOGPROB = -9999.0


class ResponseFormat(Protocol):
    """One endpoint's shapes for one request: /v1/completions or /v1/chat/completions.

    Formats keep state across a stream (chat's role chunk goes first, completions' logprob text offsets
    run on), so use a new one per request.
    """

    def response(self, deltas: list[CompletionDelta]) -> dict[str, Any]:
        """The whole response to a non-streamed request (the API server adds ``usage`` and ``metrics``)."""
        ...

    def chunks(self, delta: CompletionDelta) -> list[dict[str, Any]]:
        """The stream chunks one delta makes, possibly none (text held back, nothing else to say)."""
        ...

    def usage_chunk(self) -> dict[str, Any]:
        """A chunk with no choices, for ``stream_options.include_usage`` (the API server fills ``usage``)."""
        ...


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


def clamp_logprob(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def joined_logprobs(deltas: list[CompletionDelta]) -> list[TokenLogprobs] | None:
    """All deltas' logprobs in order, or None when the request asked for none."""
    if all(delta.logprobs is None for delta in deltas):
        return None
    return [entry for delta in deltas for entry in delta.logprobs or []]
