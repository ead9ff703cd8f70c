"""Continuous batching: which requests run this step, and how many of their tokens."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from openinfer.engine_core.core.kv_cache_manager import KVCacheManager
from openinfer.engine_core.core.request import Request, RequestStatus


class ScheduledRequest(NamedTuple):
    """What the scheduler decided for one request this step, fixed when it was decided.

    The step reads these facts, never the request's counters: by the time drafts are proposed, the update
    has already moved ``num_computed_tokens`` and appended tokens, so re-deriving "did this step sample?"
    from the request gives the wrong answer (it did for every prefill, which then never drafted).
    """

    request: Request
    start: int  # request.num_computed_tokens when scheduled: the position of the first token run
    num_new_tokens: int  # tokens of request.all_token_ids run from `start` on
    spec_token_ids: tuple[int, ...]  # draft tokens verified after the new tokens (only when `samples`)
    samples: bool  # the new tokens reach the end of the request's tokens: the next token is sampled
    admitted: bool  # its first step since it left the queue: its context from `start` on is computed anew

    @classmethod
    def of(cls, request: Request, num_new_tokens: int, admitted: bool = False) -> ScheduledRequest:
        """Schedule `num_new_tokens` of `request` and, when they complete it, its pending drafts."""
        samples = request.num_computed_tokens + num_new_tokens == request.num_tokens
        drafts = request.spec_token_ids if samples else ()
        return cls(request, request.num_computed_tokens, num_new_tokens, drafts, samples, admitted)

    @property
    def num_spec_tokens(self) -> int:
        return len(self.spec_token_ids)

    @property
    def num_scheduled_tokens(self) -> int:
        return self.num_new_tokens + len(self.spec_token_ids)

    @property
    def token_ids(self) -> list[int]:
        """The tokens run this step: the new ones, then the drafts."""
        return [
            *self.request.all_token_ids[self.start : self.start + self.num_new_tokens],
            *self.spec_token_ids,
        ]


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest]
    preempted: list[Request]

    @property
    def num_tokens(self) -> int:
        return sum(s.num_scheduled_tokens for s in self.scheduled)


class Scheduler:
    """FCFS with a per-step token budget, chunked prefill and preemption by recompute."""

    def __init__(self, kv_cache: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.kv_cache = kv_cache
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order; the last is preempted first

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def schedule(self) -> SchedulerOutput:
        # One token-count model, no phases: each step, a request's computed tokens catch up to its tokens
        # (prompt + output) plus its draft tokens. A long prompt is cut by the token budget (chunked
        # prefill); a decode is the one-token case of the same path, and verification is a decode with the
        # drafts appended.
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted: list[Request] = []

        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            start = request.num_computed_tokens
            num_new = len(request.all_token_ids) - start
            drafts = request.spec_token_ids
            if num_new > budget:
                num_new = budget
                drafts = request.spec_token_ids = ()
            elif len(drafts) > budget - num_new:
                # A draft that does not fit the budget is cut short: it is a draft with fewer tokens.
                drafts = request.spec_token_ids = drafts[: budget - num_new]
            if self._allocate_or_preempt(request, start + num_new + len(drafts), preempted):
                scheduled.append(self._scheduled(request, num_new))
                budget -= num_new + len(drafts)
                i += 1
            # else: request itself was preempted and was the last running one

        # Admit waiting requests only when nothing had to be preempted: memory is tight otherwise.
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not preempted:
            request = self.waiting[0]
            hit = self.kv_cache.lookup(request)  # its cached prefix, if any
            num_new = min(request.num_tokens - hit.num_tokens, budget)
            first = request.status != RequestStatus.PREEMPTED  # lookups are counted at the first admission
            if not self.kv_cache.admit(request, hit, num_new, counted=first):
                break
            request.num_computed_tokens = hit.num_tokens
            if first:
                request.num_cached_tokens = hit.num_tokens
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled.append(self._scheduled(request, num_new, admitted=True))
            budget -= num_new
        return SchedulerOutput(scheduled, preempted)

    def _scheduled(self, request: Request, num_new: int, admitted: bool = False) -> ScheduledRequest:
        """Schedule ``num_new`` tokens of a request that holds blocks for them; the blocks they fill are
        cached now, so a request admitted later in this step can already share them."""
        self.kv_cache.cache_blocks(request, request.num_computed_tokens + num_new)
        return ScheduledRequest.of(request, num_new, admitted)

    def _allocate_or_preempt(self, request: Request, num_slots: int, preempted: list[Request]) -> bool:
        """Grow the request's blocks to ``num_slots`` slots, preempting the latest-admitted requests until
        they fit."""
        while not self.kv_cache.allocate(request, num_slots):
            victim = self.running.pop()
            self._preempt(victim)
            preempted.append(victim)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        # Recompute: let go of the KV (cached blocks stay cached), keep the tokens; the request re-enters at
        # the head of the queue.
        self.kv_cache.free(request)
        request.num_computed_tokens = 0
        request.spec_token_ids = ()  # never verified, so never counted
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)

    def commit(self, scheduled: ScheduledRequest, num_valid: int) -> bool:
        """After the step: the `num_valid` tokens from ``scheduled.start`` on hold verified KV (the new tokens
        and the accepted drafts); the KV manager frees the blocks past them (rejected drafts' slots). True
        when it freed any."""
        request = scheduled.request
        request.num_computed_tokens = scheduled.start + num_valid
        if request.status.is_finished:  # its blocks are all freed already
            return False
        return self.kv_cache.trim(request, request.num_computed_tokens)

    def finish(self, request: Request, status: RequestStatus) -> None:
        """Take an ended request out of the queues and free its blocks."""
        assert status.is_finished
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        elif request in self.waiting:  # not there while its grammar compiles
            self.waiting.remove(request)
        request.status = status
        self.kv_cache.free(request)
