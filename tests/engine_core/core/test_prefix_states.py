"""A hybrid model's kept prefix states: positions at multiples of the interval, hits on the longest kept
prefix, slots reused least recently used first, never one a step being decided reads or writes."""

from __future__ import annotations

from openinfer.engine_core.core.prefix_states import PrefixStates

KEYS = [bytes([i]) for i in range(12)]  # block i's key (names blocks 0..i)


def test_positions_are_the_interval_multiples_a_step_passes() -> None:
    """Interval 8: a step over positions 3..20 may keep the states at 8 and 16; one ending at 24 keeps 24."""
    states = PrefixStates(2, interval=8)
    assert list(states.positions(3, 20)) == [8, 16]
    assert list(states.positions(16, 24)) == [24]  # 16 itself was kept by the step that ended there
    assert list(states.positions(0, 7)) == []


def test_a_hit_is_the_longest_kept_prefix_at_an_interval() -> None:
    """Blocks of 4, interval 8 (2 blocks): with states kept after blocks 1 and 3, a 5-block chain hits 4
    blocks (block 3's key), a 3-block chain 2 blocks; nothing is served before commit."""
    states = PrefixStates(4, interval=8)
    first, second = states.plan(KEYS[1]), states.plan(KEYS[3])
    assert first is not None and second is not None and first != second
    assert states.find(KEYS, 5, 4) is None  # planned, not committed: the step has not run
    states.commit(KEYS[1], first)
    states.commit(KEYS[3], second)
    assert states.find(KEYS, 5, 4) == (4, second)
    assert states.find(KEYS, 3, 4) == (2, first)
    assert states.find(KEYS, 1, 4) is None  # no whole interval
    assert states.plan(KEYS[3]) is None  # kept already


def test_slots_are_reused_least_recently_used_first_never_a_pinned_one() -> None:
    """Two slots: a third prefix evicts the least recently used one; a slot hit in the step being decided
    is pinned, so the other one goes; with both pinned nothing is kept."""
    states = PrefixStates(2, interval=4)
    a, b = states.plan(KEYS[0]), states.plan(KEYS[1])
    assert a is not None and b is not None
    states.commit(KEYS[0], a)
    states.commit(KEYS[1], b)
    states.unpin_all()
    assert states.find(KEYS[:1], 1, 4) == (1, a)  # key 0 hit: pinned and most recently used
    assert states.plan(KEYS[2]) == b  # key 1 (unpinned) is evicted
    assert states.plan(KEYS[3]) is None  # a is pinned by the hit, b by the plan
    states.unpin_all()
    assert states.find(KEYS[:2], 2, 4) == (1, a)  # key 1 is gone: only key 0's prefix is kept


def test_reset_forgets_kept_and_planned_states() -> None:
    """After reset every slot is free again, planned ones included, and nothing hits."""
    states = PrefixStates(2, interval=4)
    kept, planned = states.plan(KEYS[0]), states.plan(KEYS[1])
    assert kept is not None and planned is not None
    states.commit(KEYS[0], kept)
    states.reset()
    assert states.find(KEYS, 4, 4) is None
    assert {states.plan(KEYS[2]), states.plan(KEYS[3])} == {0, 1}
