"""What a generation hands the response formats: text deltas, and the request's token usage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from openinfer.protocol import SpecDecodeCounters, TokenLogprobs

# How a completion ended normally (OpenAI's finish_reason); any other engine finish is an error.
FinishKind = Literal["stop", "length"]


@dataclass(frozen=True)
class CompletionDelta:
    """What one engine output adds to a completion.

    ``token_ids`` are the tokens it adds, up to the one that completed a stop string; ``text`` is the text
    released with them (text that may start a stop string waits for the next delta).
    """

    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprobs] | None  # one per token id, when the request asked for logprobs
    finish_reason: FinishKind | None  # on the last delta, else None
    stop_reason: int | str | None  # the stop token id (from stop_token_ids) or stop string that ended it
    spec_stats: SpecDecodeCounters | None = None  # on the last delta, when the engine had a drafter


@dataclass(frozen=True)
class Usage:
    """OpenAI's ``usage``: the prompt's tokens, of which ``cached_tokens`` were found in the engine's prefix
    cache (``prompt_tokens_details.cached_tokens``), and the completion's tokens (up to the one that
    completed a stop string)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    def to_json(self) -> dict[str, Any]:
        total = self.prompt_tokens + self.completion_tokens
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": total,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }
