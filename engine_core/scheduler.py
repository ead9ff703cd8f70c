"""Continuous batching: which requests run this step, and how many of their tokens."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from openinfer.engine_core.kv_cache_manager import KVCacheManager
from openinfer.engine_core.request import Request, RequestStatus


@dataclass(frozen=True)
class ScheduledRequest:
    """This step runs ``num_new_tokens`` of ``request.all_token_ids``, from ``num_computed_tokens`` on."""

    request: Request
    num_new_tokens: int
    # the request's draft tokens verified this step, run after its new tokens (only when samples)
    num_spec_tokens: int = 0

    @property
    def samples(self) -> bool:
        """True when this step reaches the end of the request's tokens, so the next token is sampled."""
        return self.request.num_computed_tokens + self.num_new_tokens == self.request.num_tokens

    @property
    def num_scheduled_tokens(self) -> int:
        return self.num_new_tokens + self.num_spec_tokens


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
            num_new = min(request.num_uncomputed_tokens, budget)
            if num_new < request.num_uncomputed_tokens:
                request.spec_token_ids.clear()
            # A draft that does not fit the budget is cut short: it is a draft with fewer tokens.
            del request.spec_token_ids[budget - num_new :]
            num_spec = len(request.spec_token_ids)
            if self._allocate_or_preempt(request, num_new + num_spec, preempted):
                scheduled.append(ScheduledRequest(request, num_new, num_spec))
                budget -= num_new + num_spec
                i += 1
            # else: request itself was preempted and was the last running one

        # Admit waiting requests only when nothing had to be preempted: memory is tight otherwise.
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not preempted:
            request = self.waiting[0]
            num_new = min(request.num_uncomputed_tokens, budget)
            if not self.kv_cache.allocate(request.block_ids, request.num_computed_tokens + num_new):
                break
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled.append(ScheduledRequest(request, num_new))
            budget -= num_new
        return SchedulerOutput(scheduled, preempted)

    def _allocate_or_preempt(self, request: Request, num_new: int, preempted: list[Request]) -> bool:
        """Allocate ``num_new`` more slots, preempting the latest-admitted requests until they fit."""
        while not self.kv_cache.allocate(request.block_ids, request.num_computed_tokens + num_new):
            victim = self.running.pop()
            self._preempt(victim)
            preempted.append(victim)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        # Recompute: drop the KV, keep the tokens; the request re-enters at the head of the queue.
        self.kv_cache.free(request.block_ids)
        request.num_computed_tokens = 0
        request.spec_token_ids.clear()  # never verified, so never counted
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)

    def finish(self, request: Request, status: RequestStatus) -> None:
        """Take an ended request out of the queues and free its blocks."""
        assert status.is_finished
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        elif not request.status.is_finished:
            self.waiting.remove(request)
        request.status = status
        self.kv_cache.free(request.block_ids)
