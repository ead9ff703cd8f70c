"""SpecDecodeCounters: the prefix tally, the histogram, the verified and unverified counts of variable verify
lengths and DESIGN.md's invariants on any observations; and PrefixCacheCounters."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from openinfer.protocol import MAX_SPEC_TOKENS, PrefixCacheCounters, SpecDecodeCounters


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
    assert c.violation() is None


def test_a_round_verifying_nothing_is_no_draft() -> None:
    """observe_unverified(3) at K=4 moves only the unverified count; the delta it makes is not zero."""
    c = SpecDecodeCounters.zero(4)
    c.observe_unverified(3)
    assert c == SpecDecodeCounters(4, 0, 0, 0, [0] * 4, [0] * 5, [0] * 4, num_unverified_draft_tokens=3)
    assert c.violation() is None
    assert not c.minus(SpecDecodeCounters.zero(4)).is_zero() and c.minus(c).is_zero()


@st.composite
def observations(draw: st.DrawFn) -> tuple[int, list[tuple[int, int, int]]]:
    """K and rounds (P proposed, V verified, accepted): V = 0 rounds and V < P trims included."""
    k = draw(st.integers(1, MAX_SPEC_TOKENS))
    proposed = draw(st.lists(st.integers(1, k), max_size=40))
    rounds = []
    for p in proposed:
        v = draw(st.integers(0, p))
        rounds.append((p, v, draw(st.integers(0, v))))
    return k, rounds


@given(observations())
def test_invariants_hold_on_any_observations(case: tuple[int, list[tuple[int, int, int]]]) -> None:
    """After every round (observe_draft, or observe_unverified when V = 0) the counters hold DESIGN.md's
    invariants and only went up; at the end each count is the plain sum over the rounds."""
    k, rounds = case
    c = SpecDecodeCounters.zero(k)
    for proposed, verified, accepted in rounds:
        before = c.copy()
        if verified:
            c.observe_draft(verified, accepted, num_unverified=proposed - verified)
        else:
            c.observe_unverified(proposed)
        assert c.violation() is None
        assert c.minus(before).is_nonnegative()  # monotonic
        assert c.minus(before).violation() is None  # a delta holds them too
    drafts = [(v, a) for _, v, a in rounds if v]
    assert c.num_drafts == len(drafts)
    assert c.num_draft_tokens == sum(v for v, _ in drafts)
    assert c.num_accepted_tokens == sum(a for _, a in drafts)
    assert c.num_draft_tokens_per_pos == [sum(v > i for v, _ in drafts) for i in range(k)]
    assert c.num_unverified_draft_tokens == sum(p - v for p, v, _ in rounds)


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
