"""A hybrid model's state groups in the KV manager: one per running request, taken at admission and given back
with the blocks; prefix hits only as far as a kept state; the load snapshot's usage counts the groups."""

from __future__ import annotations

from openinfer.engine_core.core.kv_cache_manager import NO_HIT, KVCacheManager
from openinfer.engine_core.core.prefix_states import PrefixStates
from openinfer.engine_core.request import Request
from openinfer.protocol import SamplingParams

BLOCK = 4


def make_request(tokens: list[int], request_id: str = "r") -> Request:
    return Request(request_id, list(tokens), SamplingParams(max_tokens=8), 0.0, len(tokens) + 8)


def test_admission_takes_a_group_and_free_gives_it_back() -> None:
    """Two groups, plenty of blocks: two requests get groups 0 and 1, a third is not admitted (nothing
    changes for it); freeing one lets the third in with that group."""
    kv = KVCacheManager(64, BLOCK, num_state_groups=2)
    a, b, c = (make_request([5, 6, 7], name) for name in "abc")
    assert kv.admit(a, NO_HIT, 3, counted=True) and kv.admit(b, NO_HIT, 3, counted=True)
    assert (a.state_group, b.state_group) == (0, 1)
    assert not kv.admit(c, NO_HIT, 3, counted=True)
    assert c.state_group is None and c.block_ids == []
    kv.free(a)
    assert a.state_group is None
    assert kv.admit(c, NO_HIT, 3, counted=True) and c.state_group == 0


def test_busy_blocks_follow_the_groups_when_they_fill_first() -> None:
    """8 blocks, 2 groups: one 1-block request uses 1/8 of the blocks but 1/2 of the groups: the snapshot
    reports 4 blocks busy; a model without state reports its used blocks."""
    hybrid, plain = KVCacheManager(8, BLOCK, num_state_groups=2), KVCacheManager(8, BLOCK)
    for kv in (hybrid, plain):
        assert kv.admit(make_request([5, 6, 7]), NO_HIT, 3, counted=True)
    assert (hybrid.num_used_blocks, hybrid.num_busy_blocks) == (1, 4)
    assert plain.num_busy_blocks == 1


def test_hits_stop_at_the_longest_kept_state() -> None:
    """Interval 8 (2 blocks): a 17-token prompt's 4 cached blocks serve a hit only as far as a kept state:
    none kept, no hit; the state at 8 kept, 8 tokens and that slot; without prefix states, never a hit."""
    kv = KVCacheManager(32, BLOCK, num_state_groups=4, prefix_states=PrefixStates(2, interval=8))
    prompt = list(range(100, 117))
    first = make_request(prompt, "first")
    assert kv.admit(first, NO_HIT, 17, counted=True)
    kv.begin_step()
    kv.cache_blocks(first, 17)
    captures = kv.plan_state_captures(first, 0, 17)
    assert [position for position, _ in captures] == [8, 16]
    assert kv.lookup(make_request(prompt)) == NO_HIT  # planned, not committed: the step has not run
    kv.commit_state_captures(first, captures[:1])  # as if only the state at 8 were kept
    hit = kv.lookup(make_request(prompt))
    assert (hit.num_tokens, hit.state) == (8, captures[0][1])
    without = KVCacheManager(32, BLOCK, num_state_groups=4)
    other = make_request(prompt, "other")
    assert without.admit(other, NO_HIT, 17, counted=True)
    without.cache_blocks(other, 17)
    assert without.lookup(make_request(prompt)) == NO_HIT
