"""SpecDecodeCounters: the prefix tally, the histogram and DESIGN.md's invariants on any observations; and
PrefixCacheCounters."""

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


@st.composite
def observations(draw: st.DrawFn) -> tuple[int, list[tuple[int, int]]]:
    k = draw(st.integers(1, MAX_SPEC_TOKENS))
    drafts = draw(st.lists(st.integers(1, k), max_size=40))
    return k, [(n, draw(st.integers(0, n))) for n in drafts]


@given(observations())
def test_invariants_hold_on_any_observations(case: tuple[int, list[tuple[int, int]]]) -> None:
    """After every observe_draft, per_pos is non-increasing and the sums agree (DESIGN.md, invariants)."""
    k, drafts = case
    c = SpecDecodeCounters.zero(k)
    for num_draft_tokens, accepted in drafts:
        before = c.copy()
        c.observe_draft(num_draft_tokens, accepted)
        assert c.violation() is None
        assert c.minus(before).is_nonnegative()  # monotonic
    assert c.num_drafts == len(drafts)
    assert c.num_accepted_tokens == sum(a for _, a in drafts)


@pytest.mark.parametrize(("k", "drafted", "accepted"), [(3, 4, 0), (3, 2, 3), (3, 0, 0), (3, 2, -1)])
def test_impossible_observation_is_refused(k: int, drafted: int, accepted: int) -> None:
    """More than K drafted, more accepted than drafted, an empty draft: refused, nothing moves."""
    c = SpecDecodeCounters.zero(k)
    with pytest.raises(ValueError):
        c.observe_draft(drafted, accepted)
    assert c == SpecDecodeCounters.zero(k)


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
