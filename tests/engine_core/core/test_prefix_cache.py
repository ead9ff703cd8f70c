"""The KV manager's prefix cache, verb by verb: chained full-block keys, the last token always computed, LRU
reuse (uncached blocks first), shared blocks, first-admission counting, drafter marks (vLLM's semantics)."""

from __future__ import annotations

from openinfer.engine_core.core.kv_cache_manager import KVCacheManager
from openinfer.engine_core.core.scheduler import Scheduler
from openinfer.engine_core.request import Request
from openinfer.engine_core.spec_decode.context_blocks import ContextBlocks
from openinfer.engine_core.testing.step_outputs import sampled_output
from openinfer.protocol import PrefixCacheCounters, SamplingParams

BLOCK = 4


def make_request(tokens: list[int], request_id: str = "r") -> Request:
    params = SamplingParams(max_tokens=8)
    return Request(request_id, list(tokens), params, arrival_time=0.0, token_limit=len(tokens) + 8)


def admit(kv: KVCacheManager, tokens: list[int], request_id: str = "r") -> Request:
    """Admit a new request the way the scheduler does (it computes from its hit on) and cache the blocks its
    whole prompt fills."""
    request = make_request(tokens, request_id)
    hit = kv.lookup(request)
    assert kv.admit(request, hit, request.num_tokens - hit.num_tokens, counted=True)
    request.num_computed_tokens = hit.num_tokens
    kv.cache_blocks(request, request.num_tokens)
    return request


def test_longest_chain_of_full_blocks_before_the_last_token() -> None:
    kv = KVCacheManager(32, BLOCK)
    prompt = list(range(100, 110))  # 10 tokens: 2 full blocks and 2 tokens
    first = admit(kv, prompt)
    assert first.num_computed_tokens == 0
    assert kv.lookup(make_request(prompt)).num_tokens == 8  # both full blocks
    assert kv.lookup(make_request(prompt[:8])).num_tokens == 4  # all cached: the last block is computed
    assert kv.lookup(make_request(prompt[:9])).num_tokens == 8
    assert kv.lookup(make_request(prompt[:4] + [1, 2, 3, 4, 5])).num_tokens == 4
    assert kv.lookup(make_request(prompt[:3])).num_tokens == 0  # not a full block
    # Keys are chained: the same second block after another first block is not a hit.
    assert kv.lookup(make_request([1, 2, 3, 4] + prompt[4:])).num_tokens == 0
    second = admit(kv, prompt[:8] + [7, 7])
    assert second.block_ids[:2] == first.block_ids[:2] and second.block_ids[2] != first.block_ids[2]
    assert second.num_computed_tokens == 8
    assert kv.counters == PrefixCacheCounters(queries=20, hits=8)


def test_shared_blocks_are_held_until_every_holder_lets_go() -> None:
    kv = KVCacheManager(8, BLOCK)
    a = admit(kv, list(range(9)), "a")  # 3 blocks, 2 cached
    b = admit(kv, list(range(9)), "b")  # shares both full blocks, computes the third in a block of its own
    assert kv.num_used_blocks == 4
    kv.free(a)
    assert kv.num_used_blocks == 3  # a's partial block only
    assert kv.lookup(make_request(list(range(9)))).blocks == tuple(b.block_ids[:2])
    kv.free(b)
    assert kv.num_used_blocks == 0 and a.block_ids == b.block_ids == []
    assert kv.lookup(make_request(list(range(9)))).num_tokens == 8  # freed, still cached


def test_reuse_takes_uncached_blocks_first_then_the_least_recently_freed() -> None:
    kv = KVCacheManager(4, BLOCK)
    prompt = list(range(50, 59))  # blocks 0 and 1 cached, block 2 partial
    first = admit(kv, prompt)
    cached = first.block_ids[:2]
    kv.free(first)  # freed last block first: the partial one is reused first, then its second block
    other = make_request(list(range(200, 204)), "o")
    assert kv.allocate(other, 2 * BLOCK)  # the never-used block and the partial one
    assert not set(other.block_ids) & set(cached)
    assert kv.lookup(make_request(prompt)).num_tokens == 8
    assert kv.allocate(other, 3 * BLOCK)  # evicts the tail of the cached prefix before its head
    assert other.block_ids[2] == cached[1]
    assert kv.lookup(make_request(prompt)).num_tokens == 4


def test_admission_counts_idle_hit_blocks_against_the_free_ones() -> None:
    kv = KVCacheManager(3, BLOCK)
    kv.free(admit(kv, list(range(12))))  # 3 blocks, all cached, all free again
    request = make_request(list(range(8)) + list(range(1, 10)))  # 17 tokens: 2 hit blocks + 3 new ones
    hit = kv.lookup(request)
    assert hit.num_tokens == 8
    assert not kv.admit(request, hit, request.num_tokens - hit.num_tokens, counted=True)
    assert request.block_ids == [] and kv.num_free_blocks == 3 and kv.counters == PrefixCacheCounters(12, 0)
    assert kv.admit(request, hit, 4, counted=True)  # a chunk that fits: 2 hit blocks + 1 new one
    assert kv.num_free_blocks == 0 and kv.counters == PrefixCacheCounters(29, 8)


def test_a_preempted_request_resumes_from_its_own_blocks_counted_once() -> None:
    """vLLM counts queries and hits at a request's first admission only, not when it comes back after a
    preemption (and finds the blocks it had cached itself); its cached tokens are reported once."""
    kv = KVCacheManager(16, BLOCK)
    scheduler = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=64)
    scheduler.add(make_request(list(range(8)), "warm"))
    scheduler.add(make_request(list(range(8)) + [9, 9, 9, 9, 9], "r"))
    first = scheduler.schedule()
    assert [(s.start, s.num_new_tokens) for s in first.scheduled] == [(0, 8), (8, 5)]  # warm's 2 blocks
    request = first.scheduled[1].request
    scheduler.update_from_output(first, sampled_output([7], [7]))  # each sampled a token
    assert request.num_cached_tokens == 8 and kv.counters == PrefixCacheCounters(21, 8)
    scheduler.running.remove(request)
    scheduler._preempt(request)
    (again,) = scheduler.schedule().scheduled[1:]
    assert (again.start, again.num_new_tokens, again.admitted) == (12, 2, True)  # its 3 full blocks
    assert request.num_cached_tokens == 8 and kv.counters == PrefixCacheCounters(21, 8)


def test_a_context_reading_drafter_hits_only_blocks_it_wrote() -> None:
    kv = KVCacheManager(16, BLOCK)
    prompt = list(range(30, 43))  # 3 full blocks before the last token
    first = admit(kv, prompt)
    context = ContextBlocks(BLOCK)
    kv.hit_filter = context.holds
    assert kv.lookup(make_request(prompt)).num_tokens == 0
    context.drafter_wrote(first.block_ids, 0, 9)  # its context through position 8: blocks 0 and 1 are whole
    assert kv.lookup(make_request(prompt)).num_tokens == 8
    kv.hit_filter = ContextBlocks(BLOCK).holds  # another drafter loaded: nothing it can read
    assert kv.lookup(make_request(prompt)).num_tokens == 0
    kv.hit_filter = None  # n-gram or no drafter: the target's KV is all that counts
    assert kv.lookup(make_request(prompt)).num_tokens == 12


def test_a_key_cached_again_names_the_newer_block() -> None:
    """Two requests computed the same block (the second could not hit it: its drafter had not written it):
    the key names the second one, which the drafter marks, so later requests reuse it."""
    kv = KVCacheManager(16, BLOCK)
    context = ContextBlocks(BLOCK)
    kv.hit_filter = context.holds
    prompt = list(range(8)) + [5]
    first = admit(kv, prompt, "a")
    second = admit(kv, prompt, "b")
    assert second.num_computed_tokens == 0 and second.block_ids[:2] != first.block_ids[:2]
    context.drafter_wrote(second.block_ids, 0, 9)
    assert kv.lookup(make_request(prompt)).blocks == tuple(second.block_ids[:2])
    first_blocks = list(first.block_ids)
    kv.free(first)  # none of its blocks is cached now: they are reused first
    other = make_request([1], "o")
    assert kv.allocate(other, 3 * BLOCK) and set(other.block_ids) == set(first_blocks)


def test_reset_and_caching_off() -> None:
    kv = KVCacheManager(16, BLOCK)
    admit(kv, list(range(9)))
    kv.reset()
    assert kv.lookup(make_request(list(range(9)))).num_tokens == 0
    off = KVCacheManager(16, BLOCK, enable_caching=False)
    admit(off, list(range(9)), "a")
    second = admit(off, list(range(9)), "b")
    assert second.num_computed_tokens == 0 and off.counters is None


def test_a_reused_block_loses_its_drafter_mark() -> None:
    """A block the drafter wrote, evicted and reused by another request, is no hit for the drafter until that
    request's context is written there."""
    kv = KVCacheManager(3, BLOCK)
    context = ContextBlocks(BLOCK)
    kv.hit_filter = context.holds
    first = admit(kv, list(range(12)), "a")
    context.drafter_wrote(first.block_ids, 0, 12)
    kv.free(first)
    other = admit(kv, list(range(100, 112)), "y")  # takes a's blocks; the drafter does not draft for it
    context.target_wrote(other.block_ids, 0, 12)  # as the engine's step tells it
    kv.free(other)
    assert kv.lookup(make_request(list(range(100, 112)))).num_tokens == 0


def test_a_block_that_can_be_hit_keeps_its_key() -> None:
    """A prompt all cached still computes its last block; when that block is cached again, the key keeps
    naming the block the drafter wrote, so requests after it still hit."""
    kv = KVCacheManager(16, BLOCK)
    context = ContextBlocks(BLOCK)
    kv.hit_filter = context.holds
    first = admit(kv, list(range(12)) + [5], "a")
    context.drafter_wrote(first.block_ids, 0, 13)
    again = admit(kv, list(range(12)), "b")  # hits 2 blocks, computes the third: the same key as a's
    assert again.num_computed_tokens == 8 and again.block_ids[2] != first.block_ids[2]
    assert kv.lookup(make_request(list(range(12)) + [1])).blocks == tuple(first.block_ids[:3])


def test_drafts_are_not_cached_until_they_are_real_tokens() -> None:
    """A verify step schedules a token and 4 drafts: only the blocks full of real tokens are cached, and the
    block holding the drafts once they are accepted and the next token is scheduled."""
    kv = KVCacheManager(16, BLOCK)
    scheduler = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=64)
    request = make_request(list(range(10)))
    scheduler.add(request)
    scheduler.update_from_output(scheduler.schedule(), sampled_output([50]))  # 11 tokens
    scheduler.set_drafts(request, (51, 52, 53, 54))  # drafts for positions 11..14
    decided = scheduler.schedule()
    (verify,) = decided.scheduled
    assert (verify.num_new_tokens, verify.spec_token_ids) == (1, (51, 52, 53, 54))
    assert request.num_cached_blocks == 2  # positions 8..11 hold the token at 10 and draft slots
    scheduler.update_from_output(decided, sampled_output([51, 52, 60]))  # two drafts accepted, then a bonus
    assert request.spec_token_ids == () and request.num_computed_tokens == 13
    scheduler.schedule()
    assert request.num_cached_blocks == 3


def test_requests_share_blocks_as_soon_as_they_are_scheduled() -> None:
    """Blocks are cached when their tokens are scheduled (vLLM): a request admitted later in the same step
    reads them, written earlier in the same forward; a long prompt's first chunk is shared the same way."""
    kv = KVCacheManager(64, BLOCK)
    scheduler = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=40)
    shared = list(range(1, 17))  # 4 blocks
    scheduler.add(make_request(shared + [100, 7], "a"))
    scheduler.add(make_request(shared + [101, 7], "b"))
    out = scheduler.schedule()
    assert [(s.request.request_id, s.start, s.num_new_tokens, s.admitted) for s in out.scheduled] == [
        ("a", 0, 18, True),
        ("b", 16, 2, True),
    ]
    assert kv.counters == PrefixCacheCounters(36, 16)

    kv = KVCacheManager(64, BLOCK)
    scheduler = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=30)
    long_prompt = list(range(500, 540))
    scheduler.add(make_request(long_prompt, "long"))
    first = scheduler.schedule()
    assert [(s.num_new_tokens, s.samples) for s in first.scheduled] == [(30, False)]  # 30 of its 40 tokens
    scheduler.update_from_output(first, sampled_output())  # a prefill chunk samples nothing
    scheduler.add(make_request(long_prompt[:12] + [1, 2], "short"))
    out = scheduler.schedule()
    assert [(s.request.request_id, s.start, s.num_new_tokens, s.admitted) for s in out.scheduled] == [
        ("long", 30, 10, False),
        ("short", 12, 2, True),
    ]
