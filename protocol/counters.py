"""Speculative-decoding acceptance counters: cumulative per incarnation, moved only by the observe_* calls."""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec

# The longest speculative proposal the counters can describe (docs/design.md: K <= 32).
MAX_SPEC_TOKENS = 32
# A confidence c in [0, 1] is counted as round(c * CONFIDENCE_SCALE): integer sums stay exact and diffable.
CONFIDENCE_SCALE = 1_000_000


def num_spec_tokens_problem(k: int) -> str | None:
    """What is wrong with K = ``k``, or None: the one check of K's range (docs/design.md), wherever a K arrives
    (a drafter's load, a counters message, the admin API). Outside [1, MAX_SPEC_TOKENS] K is refused, never
    clamped."""
    if 1 <= k <= MAX_SPEC_TOKENS:
        return None
    return (
        f"num_spec_tokens (K) must be in [1, {MAX_SPEC_TOKENS}], got {k} (MAX_SPEC_TOKENS={MAX_SPEC_TOKENS}: "
        "the longest proposal the acceptance counters describe); K is never clamped"
    )


class SpecDecodeCounters(msgspec.Struct, array_like=True, gc=False):
    """Cumulative acceptance counters for one engine incarnation and one K (docs/design.md, counter semantics).

    A round is one request's proposal of P <= K tokens, of which the scheduler sends V <= P to the target in
    one verify step. A round with V >= 1 is a draft of V tokens (:meth:`observe_draft`); one with V = 0 is
    no draft (:meth:`observe_unverified`). ``accepted`` counts draft tokens that reach the output, never the
    bonus/correction token the target adds. The P - V tokens never verified count in
    ``num_unverified_draft_tokens`` and nowhere else: they were not rejected, nobody checked them.

    A draft *reaches* position i when token i was verified and every token before it accepted (i < V and
    i <= accepted): ``num_accepted_tokens_per_pos[i] / num_reached_per_pos[i]`` is the measured conditional
    acceptance at i. A drafter with a confidence head (DSpark) rates each verified token with c_i, its
    estimate of exactly that probability; ``confidence_micros_per_pos[i]`` sums round(c_i * 1e6) over the
    same drafts, so ``confidence_micros_per_pos[i] / 1e6 / num_reached_per_pos[i]`` is the head's mean
    confidence at i (its calibration, beside the measured rate). A draft without confidences adds 0 there.

    Invariants (see :meth:`violation`): both per-position tallies are non-increasing;
    ``sum(num_accepted_tokens_per_pos) == num_accepted_tokens == sum(n * hist[n])``; ``sum(hist) ==
    num_drafts``; ``sum(num_draft_tokens_per_pos) == num_draft_tokens``; ``num_draft_tokens_per_pos[0] ==
    num_drafts``; ``num_accepted_tokens_per_pos[i] <= num_draft_tokens_per_pos[i]``; ``num_accepted_tokens
    <= num_draft_tokens <= K * num_drafts``; ``num_reached_per_pos[0] == num_drafts``,
    ``num_accepted_tokens_per_pos[i] <= num_reached_per_pos[i] <= num_draft_tokens_per_pos[i]``,
    ``num_reached_per_pos[i + 1] <= num_accepted_tokens_per_pos[i]`` (so it is non-increasing) and ``0 <=
    confidence_micros_per_pos[i] <= 1e6 * num_reached_per_pos[i]``. The fields are positional on the wire:
    ``num_draft_tokens_per_pos`` and ``num_unverified_draft_tokens`` came with protocol version 3, the last
    two with version 4.
    """

    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = []  # [i]: drafts whose token i was accepted (a prefix tally)
    accepted_length_hist: list[int] = []  # [n]: drafts with n tokens accepted, n in 0..K
    num_draft_tokens_per_pos: list[int] = []  # [i]: drafts whose token i was verified (V > i)
    num_unverified_draft_tokens: int = 0  # proposed, never sent to the target (P - V summed over rounds)
    num_reached_per_pos: list[int] = []  # [i]: drafts that verified token i with tokens 0..i-1 accepted
    confidence_micros_per_pos: list[int] = []  # [i]: sum of round(c_i * 1e6) over the drafts reaching i

    @classmethod
    def zero(cls, num_spec_tokens: int) -> SpecDecodeCounters:
        """Fresh counters for K = ``num_spec_tokens``; refuses K outside [1, MAX_SPEC_TOKENS]."""
        problem = num_spec_tokens_problem(num_spec_tokens)
        if problem is not None:
            raise ValueError(problem)
        k = num_spec_tokens
        return cls(k, 0, 0, 0, [0] * k, [0] * (k + 1), [0] * k, 0, [0] * k, [0] * k)

    def observe_draft(
        self,
        num_draft_tokens: int,
        num_accepted: int,
        num_unverified: int = 0,
        confidence: Sequence[float] | None = None,
    ) -> None:
        """Count one draft: ``num_draft_tokens`` (V >= 1) tokens verified, the first ``num_accepted`` of them
        accepted, and ``num_unverified`` more proposed but left out by the scheduler (P = V + that <= K).
        ``confidence``: the drafter's rating of each verified token (V values in [0, 1]: c_i, its estimate
        that token i is accepted given tokens 0..i-1 were), or None from a drafter without a confidence head.

        ``ValueError`` (and nothing moves) for a draft that cannot be.
        """
        k = self.num_spec_tokens
        if not 0 <= num_accepted <= num_draft_tokens or num_draft_tokens < 1 or num_unverified < 0:
            raise ValueError(f"impossible draft: {num_accepted} accepted of {num_draft_tokens} (K={k})")
        if num_draft_tokens + num_unverified > k:
            raise ValueError(
                f"impossible draft: {num_draft_tokens} verified + {num_unverified} unverified tokens > K={k}"
            )
        micros = [] if confidence is None else confidence_micros(confidence, num_draft_tokens)
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        for i in range(num_accepted):  # prefix tally: accepted=2 of K=3 adds [1, 1, 0]
            self.num_accepted_tokens_per_pos[i] += 1
        self.accepted_length_hist[num_accepted] += 1
        for i in range(num_draft_tokens):  # verified=2 of K=4 adds [1, 1, 0, 0]
            self.num_draft_tokens_per_pos[i] += 1
        self.num_unverified_draft_tokens += num_unverified
        # Reached: tokens 0..accepted (the first rejected one too), never past V. V=3, accepted=1 of K=4
        # adds [1, 1, 0, 0]; V=2, accepted=2 adds [1, 1, 0, 0] (no token 2 was verified).
        for i in range(min(num_accepted + 1, num_draft_tokens)):
            self.num_reached_per_pos[i] += 1
            if micros:
                self.confidence_micros_per_pos[i] += micros[i]

    def observe_unverified(self, num_unverified: int) -> None:
        """Count a round that verified none of its ``num_unverified`` proposed tokens (V = 0: no draft, only
        the unverified count moves). ``ValueError`` unless 1 <= ``num_unverified`` <= K."""
        if not 1 <= num_unverified <= self.num_spec_tokens:
            raise ValueError(
                f"impossible round: {num_unverified} unverified tokens (K={self.num_spec_tokens})"
            )
        self.num_unverified_draft_tokens += num_unverified

    def copy(self) -> SpecDecodeCounters:
        return SpecDecodeCounters(
            self.num_spec_tokens,
            self.num_drafts,
            self.num_draft_tokens,
            self.num_accepted_tokens,
            list(self.num_accepted_tokens_per_pos),
            list(self.accepted_length_hist),
            list(self.num_draft_tokens_per_pos),
            self.num_unverified_draft_tokens,
            list(self.num_reached_per_pos),
            list(self.confidence_micros_per_pos),
        )

    def minus(self, base: SpecDecodeCounters) -> SpecDecodeCounters:
        """Field-wise ``self - base`` (same K); the caller checks that nothing went down."""
        assert base.num_spec_tokens == self.num_spec_tokens
        return SpecDecodeCounters(
            self.num_spec_tokens,
            self.num_drafts - base.num_drafts,
            self.num_draft_tokens - base.num_draft_tokens,
            self.num_accepted_tokens - base.num_accepted_tokens,
            _bin_minus(self.num_accepted_tokens_per_pos, base.num_accepted_tokens_per_pos),
            _bin_minus(self.accepted_length_hist, base.accepted_length_hist),
            _bin_minus(self.num_draft_tokens_per_pos, base.num_draft_tokens_per_pos),
            self.num_unverified_draft_tokens - base.num_unverified_draft_tokens,
            _bin_minus(self.num_reached_per_pos, base.num_reached_per_pos),
            _bin_minus(self.confidence_micros_per_pos, base.confidence_micros_per_pos),
        )

    def is_nonnegative(self) -> bool:
        return (
            min(
                self.num_drafts,
                self.num_draft_tokens,
                self.num_accepted_tokens,
                self.num_unverified_draft_tokens,
                *self.num_accepted_tokens_per_pos,
                *self.accepted_length_hist,
                *self.num_draft_tokens_per_pos,
                *self.num_reached_per_pos,
                *self.confidence_micros_per_pos,
            )
            >= 0
        )

    def is_zero(self) -> bool:
        """Whether nothing was counted (a delta of an interval without rounds)."""
        return self == self.minus(self)

    def violation(self) -> str | None:
        """Which invariant of docs/design.md these counters break, or None when they hold."""
        k = self.num_spec_tokens
        per_pos, hist = self.num_accepted_tokens_per_pos, self.accepted_length_hist
        verified = self.num_draft_tokens_per_pos
        reached, micros = self.num_reached_per_pos, self.confidence_micros_per_pos
        problem = num_spec_tokens_problem(k)
        if problem is not None:
            return problem
        if len(per_pos) != k or len(hist) != k + 1 or len(verified) != k:
            return (
                f"per_pos has {len(per_pos)} entries, hist {len(hist)} and draft_tokens_per_pos "
                f"{len(verified)}; K={k} needs {k}, {k + 1} and {k}"
            )
        if len(reached) != k or len(micros) != k:
            return (
                f"reached_per_pos has {len(reached)} entries and confidence_micros_per_pos {len(micros)}; "
                f"K={k} needs {k} each"
            )
        if not self.is_nonnegative():
            return "a negative counter"
        if any(per_pos[i] < per_pos[i + 1] for i in range(k - 1)):
            return "per_pos increases with position"
        if any(verified[i] < verified[i + 1] for i in range(k - 1)):
            return "draft_tokens_per_pos increases with position"
        if not sum(per_pos) == self.num_accepted_tokens == sum(n * h for n, h in enumerate(hist)):
            return "sum(per_pos), num_accepted_tokens and sum(n * hist[n]) differ"
        if sum(hist) != self.num_drafts:
            return "sum(hist) != num_drafts"
        if sum(verified) != self.num_draft_tokens:
            return "sum(draft_tokens_per_pos) != num_draft_tokens"
        if verified[0] != self.num_drafts:
            return "draft_tokens_per_pos[0] != num_drafts"
        if any(a > v for a, v in zip(per_pos, verified, strict=True)):
            return "a position with more tokens accepted than verified"
        if not self.num_accepted_tokens <= self.num_draft_tokens <= k * self.num_drafts:
            return "not accepted <= draft tokens <= K * drafts"
        if reached[0] != self.num_drafts:
            return "reached_per_pos[0] != num_drafts"
        if any(not a <= r <= v for a, r, v in zip(per_pos, reached, verified, strict=True)):
            return "not accepted <= reached <= verified at a position"
        if any(reached[i + 1] > per_pos[i] for i in range(k - 1)):
            return "more drafts reached a position than had the one before it accepted"
        if any(m > CONFIDENCE_SCALE * r for m, r in zip(micros, reached, strict=True)):
            return "confidence_micros_per_pos above 1e6 * reached_per_pos"
        return None


def confidence_micros(confidence: Sequence[float], num_draft_tokens: int) -> list[int]:
    """Each of a draft's ``num_draft_tokens`` confidences as round(c * 1e6); ``ValueError`` unless there are
    that many, each a finite number in [0, 1]."""
    if len(confidence) != num_draft_tokens:
        raise ValueError(
            f"{len(confidence)} confidences for a draft of {num_draft_tokens} verified tokens: give one per "
            "verified token"
        )
    if not all(math.isfinite(c) and 0.0 <= c <= 1.0 for c in confidence):
        raise ValueError(f"confidences must be finite numbers in [0, 1], got {list(confidence)}")
    return [round(c * CONFIDENCE_SCALE) for c in confidence]


def _bin_minus(counts: list[int], base: list[int]) -> list[int]:
    return [a - b for a, b in zip(counts, base, strict=True)]


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
