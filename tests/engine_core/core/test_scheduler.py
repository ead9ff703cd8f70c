"""Scheduler and KV-cache manager: token budget, chunked prefill, FCFS, preemption by recompute."""

from __future__ import annotations

from openinfer.engine_core.core.kv_cache_manager import KVCacheManager
from openinfer.engine_core.core.scheduler import Scheduler
from openinfer.engine_core.request import Request, RequestStatus
from openinfer.engine_core.scheduler_output import SchedulerOutput
from openinfer.engine_core.testing.step_outputs import sampled_output
from openinfer.protocol import SamplingParams


def make_request(request_id: str, num_prompt_tokens: int, max_tokens: int = 8) -> Request:
    return Request(
        request_id,
        list(range(1, num_prompt_tokens + 1)),
        SamplingParams(max_tokens=max_tokens),
        arrival_time=0.0,
        token_limit=num_prompt_tokens + max_tokens,
    )


def run_step(scheduler: Scheduler, decided: SchedulerOutput, new_token: int = 7) -> None:
    """Book the step as the engine core does: every sampling request sampled ``new_token``."""
    scheduler.update_from_output(decided, sampled_output(*([new_token] for _ in decided.sampling)))


def test_kv_manager_allocates_whole_blocks_and_frees() -> None:
    """Slots round up to blocks; a failed allocation changes nothing; free returns every block."""
    kv = KVCacheManager(num_blocks=4, block_size=16)
    request = make_request("a", 4)
    table = request.block_ids
    assert kv.allocate(request, 17)  # 17 slots = 2 blocks
    assert len(table) == 2 and kv.num_free_blocks == 2
    assert not kv.allocate(request, 65)  # 65 slots = 5 blocks > 4
    assert len(table) == 2 and kv.num_free_blocks == 2
    assert kv.allocate(request, 64)
    assert kv.num_free_blocks == 0
    kv.free(request)
    assert table == [] and kv.num_free_blocks == 4


def test_chunked_prefill_respects_token_budget() -> None:
    """A 40-token prompt under a 16-token budget is computed 16 + 16 + 8, sampling only at the end."""
    scheduler = Scheduler(KVCacheManager(64, 16), max_num_seqs=8, max_num_batched_tokens=16)
    request = make_request("a", 40)
    scheduler.add(request)
    chunks = []
    for _ in range(3):
        out = scheduler.schedule()
        chunks.append((out.scheduled[0].num_new_tokens, out.scheduled[0].samples))
        run_step(scheduler, out)
    assert chunks == [(16, False), (16, False), (8, True)]
    assert request.num_tokens == 41 and request.num_computed_tokens == 40
    out = scheduler.schedule()  # a decode is the one-token case of the same path
    assert [(s.num_new_tokens, s.samples) for s in out.scheduled] == [(1, True)]


def test_fcfs_admission_and_budget_shared() -> None:
    """Running requests go first; waiting ones are admitted in arrival order while the budget lasts."""
    scheduler = Scheduler(KVCacheManager(64, 16), max_num_seqs=8, max_num_batched_tokens=20)
    for name, n in [("a", 10), ("b", 8), ("c", 5)]:
        scheduler.add(make_request(name, n))
    out = scheduler.schedule()
    assert [(s.request.request_id, s.num_new_tokens) for s in out.scheduled] == [
        ("a", 10),
        ("b", 8),
        ("c", 2),
    ]
    run_step(scheduler, out)
    out = scheduler.schedule()
    # a and b decode one token each; c finishes its prompt
    assert [(s.request.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 1), ("b", 1), ("c", 3)]


def test_max_num_seqs_bounds_running() -> None:
    """No more than max_num_seqs requests run at once; the rest wait."""
    scheduler = Scheduler(KVCacheManager(64, 16), max_num_seqs=2, max_num_batched_tokens=100)
    for name in "abc":
        scheduler.add(make_request(name, 4))
    out = scheduler.schedule()
    assert [s.request.request_id for s in out.scheduled] == ["a", "b"]
    assert [r.request_id for r in scheduler.waiting] == ["c"]


def test_preemption_by_recompute_takes_the_latest_request() -> None:
    """When blocks run out the last-admitted request loses its KV and returns to the head of the queue."""
    kv = KVCacheManager(num_blocks=2, block_size=4, enable_caching=False)  # 8 slots in all
    scheduler = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=100)
    a, b = make_request("a", 4), make_request("b", 4)
    scheduler.add(a)
    scheduler.add(b)
    run_step(scheduler, scheduler.schedule())  # both prefilled: 1 block each, each sampled 1 token
    assert kv.num_free_blocks == 0
    out = scheduler.schedule()  # a needs a 2nd block for its 5th token: b is preempted
    assert out.preempted == [b]
    assert [s.request.request_id for s in out.scheduled] == ["a"]
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0 and b.block_ids == []
    assert b.num_tokens == 5  # its sampled token is kept and recomputed later
    assert list(scheduler.waiting) == [b]
    run_step(scheduler, out)
    scheduler.finish(a, RequestStatus.FINISHED_LENGTH)
    out = scheduler.schedule()  # b comes back and recomputes prompt + its token in one chunk
    assert [(s.request.request_id, s.num_new_tokens, s.samples) for s in out.scheduled] == [("b", 5, True)]


def test_finish_frees_blocks_from_any_queue() -> None:
    """Finishing a running or a waiting request removes it and frees its blocks."""
    kv = KVCacheManager(8, 4)
    scheduler = Scheduler(kv, max_num_seqs=1, max_num_batched_tokens=100)
    a, b = make_request("a", 6), make_request("b", 3)
    scheduler.add(a)
    scheduler.add(b)
    scheduler.schedule()
    scheduler.finish(b, RequestStatus.FINISHED_ABORTED)
    scheduler.finish(a, RequestStatus.FINISHED_ABORTED)
    assert not scheduler.has_work and kv.num_free_blocks == 8


def test_update_appends_until_a_stop_and_finishes() -> None:
    """A verify step whose accepted run holds a stop token keeps the tokens up to it, counts the drafts
    accepted before it, ends the request (its blocks freed) and hands it to the worker's rows as finished."""
    kv = KVCacheManager(8, 4)
    scheduler = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64)
    request = make_request("a", 5, max_tokens=20)
    request.stop_ids = frozenset({9})
    scheduler.add(request)
    run_step(scheduler, scheduler.schedule())  # prefill: 5 tokens, then 7
    scheduler.set_drafts(request, (3, 9, 4))
    decided = scheduler.schedule()
    assert decided.drafts == [(3, 9, 4)] and decided.logits_starts == [0] and decided.num_logits == 4
    (update,) = scheduler.update_from_output(decided, sampled_output([3, 9, 4, 8]))  # all 3 accepted
    assert (update.num_kept, update.num_accepted, update.num_valid) == (2, 2, 4)  # cut at the stop token 9
    assert request.all_token_ids[5:] == [7, 3, 9] and request.status == RequestStatus.FINISHED_STOPPED
    assert request.finish is not None and request.finish.stop_token_id == 9
    assert kv.num_free_blocks == 8 and request.spec_token_ids == ()
    assert scheduler.schedule().finished == [request]


def test_update_trims_rejected_drafts_and_reports_the_cut_table() -> None:
    """Rejected drafts' blocks are freed after the step and the next decision names the request whose table
    was cut (the worker rewrites its row's table)."""
    kv = KVCacheManager(16, 4, enable_caching=False)
    scheduler = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64)
    request = make_request("a", 4, max_tokens=20)
    scheduler.add(request)
    run_step(scheduler, scheduler.schedule())  # 5 tokens: 2 blocks
    scheduler.set_drafts(request, (1, 2, 3, 4, 5, 6))  # positions 5..10: 3 blocks
    decided = scheduler.schedule()
    assert len(request.block_ids) == 3
    (update,) = scheduler.update_from_output(decided, sampled_output([1, 8]))  # one accepted, then 8
    assert (update.num_kept, update.num_accepted, update.num_valid) == (2, 1, 2)
    assert request.num_computed_tokens == 6 and len(request.block_ids) == 2  # 6 slots = 2 blocks of 4
    assert scheduler.schedule().cut == [request]
