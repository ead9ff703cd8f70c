"""Per-request state inside the engine: plain counters, derived values as properties."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from openinfer.protocol import (
    EngineCoreOutput,
    FinishReason,
    SamplingParams,
    SpecDecodeCounters,
    TokenLogprobs,
)

if TYPE_CHECKING:
    from openinfer.engine_core.request_grammar import RequestGrammar

_MIN_TEMPERATURE = 1e-5


class RequestStatus(enum.IntEnum):
    """Ordered: everything at or past FINISHED_STOPPED has ended."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5
    FINISHED_ERROR = 6

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> FinishReason:
        """What the frontend is told of a request that ended so, with no more said (an ended status only)."""
        return _FINISH_REASONS[self]


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason("stop"),
    RequestStatus.FINISHED_LENGTH: FinishReason("length"),
    RequestStatus.FINISHED_ABORTED: FinishReason("abort"),
    RequestStatus.FINISHED_ERROR: FinishReason("error"),
}


@dataclass(eq=False, slots=True)
class Request:
    """One request's tokens, progress through the model, KV blocks and sampler state."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float
    # the most tokens (prompt + output) it may reach: max_tokens after the prompt, or the model length
    token_limit: int
    # prompt + output; the tokens the model must have computed before the next sample
    all_token_ids: list[int] = field(default_factory=list)
    # tokens of all_token_ids whose K/V are in this request's blocks
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    # a hybrid model's state group (StateGeometry) while it runs, the KV manager's to hand out; else None
    state_group: int | None = None
    # the prefix state slot its admission's prefix hit starts from (a hybrid model's); None: from position 0
    prefix_state: int | None = None
    status: RequestStatus = RequestStatus.WAITING
    finish: FinishReason | None = None
    # seeded generator when sampling_params.seed is set; it survives preemption
    generator: torch.Generator | None = None
    # output tokens not yet sent to the frontend
    num_sent_tokens: int = 0
    # draft tokens proposed after the last token, verified in the next step (never part of all_token_ids)
    spec_token_ids: tuple[int, ...] = ()
    # the drafts its drafter proposed for that round (>= len(spec_token_ids): a confidence rule or the token
    # budget may verify fewer; the rest count as unverified); 0 when no round is pending
    num_proposed_drafts: int = 0
    # (>= len(spec_token_ids), vocab) on the device: the distribution each draft was drawn from, when its
    # drafter sampled them (temperature > 0); None: greedy drafts (a one-hot q). Rejection sampling reads it.
    spec_probs: torch.Tensor | None = None
    # this request's speculative counts, from its first draft on (moved only by observe_draft)
    spec_counters: SpecDecodeCounters | None = None
    # logprobs of the output tokens not yet sent, one per token (None: the request did not ask for them)
    unsent_logprobs: list[TokenLogprobs] | None = None
    # tokens that end it when sampled: its stop_token_ids, and the model's EOS ids unless ignore_eos
    stop_ids: frozenset[int] = frozenset()
    # prefix caching (the KV manager's): the chained keys of its full blocks of tokens, as far as computed;
    # how many of its first blocks are cached; the prompt tokens its first admission found cached
    prefix_keys: list[bytes] = field(default_factory=list)
    num_cached_blocks: int = 0
    num_cached_tokens: int = 0
    # whether any of the logits processors applies to it (penalties, min_tokens, logit bias, bad words);
    # derived from sampling_params once, so that a request without them costs nothing per step
    processes_logits: bool = False
    # its place in its structured-output grammar (None: unconstrained, or its grammar is still compiling)
    grammar: RequestGrammar | None = None

    def __post_init__(self) -> None:
        if not self.all_token_ids:
            self.all_token_ids = list(self.prompt_token_ids)
        params = self.sampling_params
        self.processes_logits = bool(
            params.presence_penalty
            or params.frequency_penalty
            or params.repetition_penalty != 1.0
            or params.min_tokens
            or params.logit_bias
            or params.bad_words_token_ids
        )
        if self.sampling_params.logprobs is not None and self.unsent_logprobs is None:
            self.unsent_logprobs = []

    @property
    def temperature(self) -> float:
        """The sampling temperature; below 1e-5 it is greedy (vLLM's rule: dividing by it overflows)."""
        temperature = self.sampling_params.temperature
        return temperature if temperature >= _MIN_TEMPERATURE else 0.0

    @property
    def spec_stats(self) -> SpecDecodeCounters | None:
        """This request's speculative counts as the frontend receives them (None before its first draft)."""
        return None if self.spec_counters is None else self.spec_counters.copy()

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - len(self.prompt_token_ids)

    def take_output(self) -> EngineCoreOutput:
        """The output tokens (and logprobs) not yet sent, now counted as sent; the finish and stats once it
        ended."""
        start = len(self.prompt_token_ids) + self.num_sent_tokens
        new_token_ids = self.all_token_ids[start:]
        cached = self.num_cached_tokens if self.num_sent_tokens == 0 else 0  # on its first output
        self.num_sent_tokens += len(new_token_ids)
        logprobs, self.unsent_logprobs = self.unsent_logprobs, None if self.unsent_logprobs is None else []
        if not self.status.is_finished:
            return EngineCoreOutput(self.request_id, new_token_ids, None, cached, logprobs=logprobs)
        return EngineCoreOutput(
            self.request_id,
            new_token_ids,
            self.finish,
            cached,
            spec_stats=self.spec_stats,
            logprobs=logprobs,
        )
