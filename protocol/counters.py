"""Speculative-decoding acceptance counters: cumulative per incarnation, moved only by observe_draft."""

from __future__ import annotations

import msgspec

# The longest speculative proposal the counters can describe (DESIGN.md: K <= 32).
MAX_SPEC_TOKENS = 32


class SpecDecodeCounters(msgspec.Struct, array_like=True, gc=False):
    """Cumulative acceptance counters for one engine incarnation and one K (DESIGN.md, counter semantics).

    A draft is one request's proposal of at least one token checked in one verify step. ``accepted`` counts
    draft tokens that reach the output, never the bonus/correction token the target adds.
    Invariants (see :meth:`violation`): ``per_pos`` is non-increasing; ``sum(per_pos) == num_accepted_tokens
    == sum(n * hist[n])``; ``sum(hist) == num_drafts``; ``num_accepted_tokens <= num_draft_tokens <= K *
    num_drafts``.
    """

    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = []
    accepted_length_hist: list[int] = []

    @classmethod
    def zero(cls, num_spec_tokens: int) -> SpecDecodeCounters:
        """Fresh counters for K = ``num_spec_tokens``; refuses K outside [1, MAX_SPEC_TOKENS]."""
        if not 1 <= num_spec_tokens <= MAX_SPEC_TOKENS:
            raise ValueError(
                f"num_spec_tokens (K) must be in [1, MAX_SPEC_TOKENS={MAX_SPEC_TOKENS}], "
                f"got {num_spec_tokens}; K is never clamped"
            )
        return cls(num_spec_tokens, 0, 0, 0, [0] * num_spec_tokens, [0] * (num_spec_tokens + 1))

    def observe_draft(self, num_draft_tokens: int, num_accepted: int) -> None:
        """Count one draft of ``num_draft_tokens`` tokens whose first ``num_accepted`` were accepted."""
        if not 0 <= num_accepted <= num_draft_tokens <= self.num_spec_tokens or num_draft_tokens < 1:
            raise ValueError(
                f"impossible draft: {num_accepted} accepted of {num_draft_tokens} (K={self.num_spec_tokens})"
            )
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        for i in range(num_accepted):  # prefix tally: accepted=2 of K=3 adds [1, 1, 0]
            self.num_accepted_tokens_per_pos[i] += 1
        self.accepted_length_hist[num_accepted] += 1

    def copy(self) -> SpecDecodeCounters:
        return SpecDecodeCounters(
            self.num_spec_tokens,
            self.num_drafts,
            self.num_draft_tokens,
            self.num_accepted_tokens,
            list(self.num_accepted_tokens_per_pos),
            list(self.accepted_length_hist),
        )

    def minus(self, base: SpecDecodeCounters) -> SpecDecodeCounters:
        """Field-wise ``self - base`` (same K); the caller checks that nothing went down."""
        assert base.num_spec_tokens == self.num_spec_tokens
        return SpecDecodeCounters(
            self.num_spec_tokens,
            self.num_drafts - base.num_drafts,
            self.num_draft_tokens - base.num_draft_tokens,
            self.num_accepted_tokens - base.num_accepted_tokens,
            [
                a - b
                for a, b in zip(
                    self.num_accepted_tokens_per_pos, base.num_accepted_tokens_per_pos, strict=True
                )
            ],
            [a - b for a, b in zip(self.accepted_length_hist, base.accepted_length_hist, strict=True)],
        )

    def is_nonnegative(self) -> bool:
        return (
            min(
                self.num_drafts,
                self.num_draft_tokens,
                self.num_accepted_tokens,
                *self.num_accepted_tokens_per_pos,
                *self.accepted_length_hist,
            )
            >= 0
        )

    def violation(self) -> str | None:
        """Which invariant of DESIGN.md these counters break, or None when they hold."""
        k = self.num_spec_tokens
        per_pos, hist = self.num_accepted_tokens_per_pos, self.accepted_length_hist
        if not 1 <= k <= MAX_SPEC_TOKENS:
            return f"K={k} outside [1, {MAX_SPEC_TOKENS}]"
        if len(per_pos) != k or len(hist) != k + 1:
            return f"per_pos has {len(per_pos)} entries and hist {len(hist)}; K={k} needs {k} and {k + 1}"
        if not self.is_nonnegative():
            return "a negative counter"
        if any(per_pos[i] < per_pos[i + 1] for i in range(k - 1)):
            return "per_pos increases with position"
        if not sum(per_pos) == self.num_accepted_tokens == sum(n * h for n, h in enumerate(hist)):
            return "sum(per_pos), num_accepted_tokens and sum(n * hist[n]) differ"
        if sum(hist) != self.num_drafts:
            return "sum(hist) != num_drafts"
        if not self.num_accepted_tokens <= self.num_draft_tokens <= k * self.num_drafts:
            return "not accepted <= draft tokens <= K * drafts"
        return None


class PrefixCacheCounters(msgspec.Struct, array_like=True, gc=False):
    """Prefix-cache lookups, cumulative per engine incarnation, in tokens (vLLM's semantics): when a request
    is admitted for the first time (never again after a preemption), ``queries`` grows by its tokens and
    ``hits`` by the tokens its cached blocks held. So ``0 <= hits <= queries``."""

    queries: int = 0
    hits: int = 0

    def record(self, num_tokens: int, num_hits: int) -> None:
        self.queries += num_tokens
        self.hits += num_hits

    def minus(self, other: PrefixCacheCounters) -> PrefixCacheCounters:
        return PrefixCacheCounters(self.queries - other.queries, self.hits - other.hits)

    def copy(self) -> PrefixCacheCounters:
        return PrefixCacheCounters(self.queries, self.hits)

    def is_nonnegative(self) -> bool:
        return min(self.queries, self.hits) >= 0

    def violation(self) -> str | None:
        """Which invariant these counters (or a delta of them) break, or None when they hold."""
        if not self.is_nonnegative():
            return "a negative prefix-cache counter"
        if self.hits > self.queries:
            return "more prefix-cache hits than queries"
        return None
