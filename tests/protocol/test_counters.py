"""SpecDecodeCounters: the prefix tally, the histogram, the verified and unverified counts of variable verify
lengths, the reached counts and confidence sums of a confidence head, and docs/design.md's invariants on any
observations; and PrefixCacheCounters."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from openinfer.protocol import MAX_SPEC_TOKENS, PrefixCacheCounters, SpecDecodeCounters
from openinfer.protocol.counters import CONFIDENCE_SCALE


def test_prefix_tally_example() -> None:
    """K=3 with accepted 2, 1, 0 gives per_pos [2, 1, 0] and hist [1, 1, 1, 0]."""
    c = SpecDecodeCounters.zero(3)
    for accepted in (2, 1, 0):
        c.observe_draft(3, accepted)
    assert c.num_accepted_tokens_per_pos == [2, 1, 0]
    assert c.accepted_length_hist == [1, 1, 1, 0]
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens) == (3, 9, 3)
    assert c.num_draft_tokens_per_pos == [3, 3, 3]  # every draft verified whole
    assert c.num_unverified_draft_tokens == 0
    assert c.num_reached_per_pos == [3, 2, 1]  # tokens 0..accepted: [1, 1, 1] + [1, 1, 0] + [1, 0, 0]
    assert c.confidence_micros_per_pos == [0, 0, 0]  # no confidence head


def test_trimmed_draft_counts_verified_tokens_only() -> None:
    """K=4, P=4 proposed, V=2 verified, 1 accepted: a draft of 2 tokens (verified per position [1, 1, 0, 0]),
    the 2 left out unverified and nowhere else (not rejected: draft tokens 2, not 4)."""
    c = SpecDecodeCounters.zero(4)
    c.observe_draft(2, 1, num_unverified=2)
    assert c == SpecDecodeCounters(
        4,
        num_drafts=1,
        num_draft_tokens=2,
        num_accepted_tokens=1,
        num_accepted_tokens_per_pos=[1, 0, 0, 0],
        accepted_length_hist=[0, 1, 0, 0, 0],
        num_draft_tokens_per_pos=[1, 1, 0, 0],
        num_unverified_draft_tokens=2,
        num_reached_per_pos=[1, 1, 0, 0],  # token 0 accepted, token 1 rejected
        confidence_micros_per_pos=[0, 0, 0, 0],
    )
    assert c.violation() is None


def test_rounds_of_varying_verify_lengths() -> None:
    """K=4: rounds (P, V, accepted) = (4, 4, 4), (4, 3, 1), (3, 1, 0) and (4, 0, -): three drafts of 4, 3
    and 1 tokens (verified per position [3, 2, 2, 1]) and 1 + 2 + 4 = 7 unverified tokens; the V = 0 round
    is no draft. Position 1's conditional acceptance is 1/2, its unconditional 1/3."""
    c = SpecDecodeCounters.zero(4)
    c.observe_draft(4, 4)
    c.observe_draft(3, 1, num_unverified=1)
    c.observe_draft(1, 0, num_unverified=2)
    c.observe_unverified(4)
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens) == (3, 8, 5)
    assert c.num_draft_tokens_per_pos == [3, 2, 2, 1]
    assert c.num_accepted_tokens_per_pos == [2, 1, 1, 1]
    assert c.accepted_length_hist == [1, 1, 0, 0, 1]
    assert c.num_unverified_draft_tokens == 7
    # reached: (4, 4) all four; (3, 1) tokens 0 and 1; (1, 0) token 0 only
    assert c.num_reached_per_pos == [3, 2, 1, 1]
    assert c.violation() is None


def test_a_round_verifying_nothing_is_no_draft() -> None:
    """observe_unverified(3) at K=4 moves only the unverified count; the delta it makes is not zero."""
    c = SpecDecodeCounters.zero(4)
    c.observe_unverified(3)
    assert c == SpecDecodeCounters(4, 0, 0, 0, [0] * 4, [0] * 5, [0] * 4, 3, [0] * 4, [0] * 4)
    assert c.violation() is None
    assert not c.minus(SpecDecodeCounters.zero(4)).is_zero() and c.minus(c).is_zero()


def test_confidences_sum_over_the_positions_reached() -> None:
    """K=4, three drafts with confidences: each adds round(c * 1e6) at the positions it reached (verified,
    everything before accepted), never past its first rejected token or its V; reached[i] moves for each.

    (V=4, accepted=4, c=[.9, .8, .7, .6]): all four; (V=3 of P=4, accepted=1, c=[.95, .5, .25]): tokens 0
    and 1, the .25 of token 2 is never reached (token 1 was rejected); (V=2, accepted=2, c=[.3, 1.0]): tokens
    0 and 1 (no token 2 was verified)."""
    c = SpecDecodeCounters.zero(4)
    c.observe_draft(4, 4, confidence=[0.9, 0.8, 0.7, 0.6])
    c.observe_draft(3, 1, num_unverified=1, confidence=[0.95, 0.5, 0.25])
    c.observe_draft(2, 2, confidence=[0.3, 1.0])
    assert c.num_reached_per_pos == [3, 3, 1, 1]
    assert c.confidence_micros_per_pos == [2_150_000, 2_300_000, 700_000, 600_000]
    assert c.num_accepted_tokens_per_pos == [3, 2, 1, 1]
    assert c.num_draft_tokens_per_pos == [3, 3, 2, 1]
    assert c.violation() is None
    # mean confidence against measured conditional acceptance, position 1: 2.3 / 3 against 2 / 3
    assert c.confidence_micros_per_pos[1] / CONFIDENCE_SCALE / c.num_reached_per_pos[1] == pytest.approx(
        2.3 / 3
    )


def test_confidences_round_to_micros() -> None:
    """Each confidence is counted as the nearest integer millionth: 0.1234567 -> 123457, 1e-7 -> 0."""
    c = SpecDecodeCounters.zero(2)
    c.observe_draft(2, 1, confidence=[0.1234567, 1e-7])
    assert c.confidence_micros_per_pos == [123_457, 0]


def test_a_draft_without_confidences_moves_reached_only() -> None:
    """A drafter without a confidence head: reached counts as ever, the confidence sums stay 0."""
    c = SpecDecodeCounters.zero(3)
    c.observe_draft(3, 1, confidence=[0.5, 0.5, 0.5])
    c.observe_draft(2, 0)
    assert c.num_reached_per_pos == [2, 1, 0]
    assert c.confidence_micros_per_pos == [500_000, 500_000, 0]  # the first draft's only


@pytest.mark.parametrize(
    "confidence",
    [[0.5], [0.5, 0.5, 0.5], [0.5, 1.5], [-0.1, 0.5], [0.5, math.nan], [math.inf, 0.5]],
    ids=["too-few", "too-many", "above-1", "negative", "nan", "inf"],
)
def test_impossible_confidences_are_refused(confidence: list[float]) -> None:
    """A draft of V=2 takes exactly two finite confidences in [0, 1]; anything else is refused and nothing
    moves."""
    c = SpecDecodeCounters.zero(3)
    with pytest.raises(ValueError, match="confidence"):
        c.observe_draft(2, 1, confidence=confidence)
    assert c == SpecDecodeCounters.zero(3)


@st.composite
def observations(draw: st.DrawFn) -> tuple[int, list[tuple[int, int, int]]]:
    """K and rounds (P proposed, V verified, accepted): V = 0 rounds and V < P trims included."""
    k = draw(st.integers(1, MAX_SPEC_TOKENS))
    proposed = draw(st.lists(st.integers(1, k), max_size=40))
    rounds = []
    for p in proposed:
        v = draw(st.integers(0, p))
        confidence = draw(st.none() | st.lists(st.floats(0.0, 1.0), min_size=v, max_size=v))
        rounds.append((p, v, draw(st.integers(0, v)), confidence))
    return k, rounds


Rounds = list[tuple[int, int, int, list[float] | None]]


@given(observations())
def test_invariants_hold_on_any_observations(case: tuple[int, Rounds]) -> None:
    """After every round (observe_draft, or observe_unverified when V = 0) the counters hold docs/design.md's
    invariants and only went up; at the end each count is the plain sum over the rounds."""
    k, rounds = case
    c = SpecDecodeCounters.zero(k)
    for proposed, verified, accepted, confidence in rounds:
        before = c.copy()
        if verified:
            c.observe_draft(verified, accepted, num_unverified=proposed - verified, confidence=confidence)
        else:
            c.observe_unverified(proposed)
        assert c.violation() is None
        assert c.minus(before).is_nonnegative()  # monotonic
        assert c.minus(before).violation() is None  # a delta holds them too
    drafts = [(v, a, conf) for _, v, a, conf in rounds if v]
    assert c.num_drafts == len(drafts)
    assert c.num_draft_tokens == sum(v for v, _, _ in drafts)
    assert c.num_accepted_tokens == sum(a for _, a, _ in drafts)
    assert c.num_draft_tokens_per_pos == [sum(v > i for v, _, _ in drafts) for i in range(k)]
    assert c.num_unverified_draft_tokens == sum(p - v for p, v, _, _ in rounds)
    assert c.num_reached_per_pos == [sum(v > i and a >= i for v, a, _ in drafts) for i in range(k)]
    assert c.confidence_micros_per_pos == [
        sum(round(conf[i] * 1e6) for v, a, conf in drafts if conf and v > i and a >= i) for i in range(k)
    ]


@pytest.mark.parametrize(("k", "drafted", "accepted"), [(3, 4, 0), (3, 2, 3), (3, 0, 0), (3, 2, -1)])
def test_impossible_observation_is_refused(k: int, drafted: int, accepted: int) -> None:
    """More than K drafted, more accepted than drafted, an empty draft: refused, nothing moves."""
    c = SpecDecodeCounters.zero(k)
    with pytest.raises(ValueError):
        c.observe_draft(drafted, accepted)
    assert c == SpecDecodeCounters.zero(k)


@pytest.mark.parametrize(("k", "verified", "unverified"), [(3, 2, 2), (3, 1, -1), (3, 3, 1)])
def test_impossible_trimmed_draft_is_refused(k: int, verified: int, unverified: int) -> None:
    """More than K proposed (verified + unverified) or a negative unverified count: refused, nothing moves."""
    c = SpecDecodeCounters.zero(k)
    with pytest.raises(ValueError):
        c.observe_draft(verified, 0, num_unverified=unverified)
    assert c == SpecDecodeCounters.zero(k)


@pytest.mark.parametrize("unverified", [0, -1, 4])
def test_impossible_unverified_round_is_refused(unverified: int) -> None:
    """A round verifying nothing proposed 1..K tokens: 0, negative or more than K=3 is refused."""
    c = SpecDecodeCounters.zero(3)
    with pytest.raises(ValueError, match="impossible round"):
        c.observe_unverified(unverified)
    assert c == SpecDecodeCounters.zero(3)


@pytest.mark.parametrize("k", [0, 33, 100])
def test_k_outside_limit_is_refused_not_clamped(k: int) -> None:
    """K must be in [1, 32]; the error names the limit."""
    with pytest.raises(ValueError, match="MAX_SPEC_TOKENS=32"):
        SpecDecodeCounters.zero(k)


def test_prefix_cache_counters_deltas_and_invariant() -> None:
    """Lookups add tokens and hits; a delta is field-wise; hits above queries or a negative field break
    the invariant, and is_nonnegative tells a decrease apart from an impossible delta."""
    c = PrefixCacheCounters()
    c.record(64, 48)  # 4 blocks of 16 looked up, 3 cached
    before = c.copy()
    c.record(16, 0)
    assert (c.queries, c.hits) == (80, 48) and c.violation() is None
    assert c.minus(before) == PrefixCacheCounters(16, 0)
    assert not before.minus(c).is_nonnegative()  # went down
    assert (
        PrefixCacheCounters(10, 11).is_nonnegative() and PrefixCacheCounters(10, 11).violation() is not None
    )
    assert PrefixCacheCounters(-1, 0).violation() == "a negative prefix-cache counter"
