"""Continuous batching: which requests run this step, and how many of their tokens; and, after the step,
every state transition the step's output causes (appending, stopping, committing KV, finishing)."""

from __future__ import annotations

from collections import deque

from openinfer.engine_core.core.kv_cache_manager import KVCacheManager
from openinfer.engine_core.request import Request, RequestStatus
from openinfer.engine_core.scheduler_output import RequestUpdate, ScheduledRequest, SchedulerOutput
from openinfer.engine_core.worker.runner_output import ModelRunnerOutput
from openinfer.protocol import FinishReason

# How a request ends: its status and, when there is more to say than the status, why.
_Ending = tuple[RequestStatus, FinishReason | None]


class Scheduler:
    """FCFS with a per-step token budget, chunked prefill and preemption by recompute.

    It is the one writer of a request's progress: its tokens, computed tokens, drafts (``set_drafts``),
    status and blocks (through the KV manager).
    """

    def __init__(self, kv_cache: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.kv_cache = kv_cache
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order; the last is preempted first
        # Since the last decision: requests that ended, and running requests whose block table was cut short
        # (both go to the worker's persistent rows with the next decision).
        self._finished: list[Request] = []
        self._cut: list[Request] = []

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
        self.kv_cache.begin_step()
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
                drafts = self.set_drafts(request, ())
            elif len(drafts) > budget - num_new:
                # A draft that does not fit the budget is cut short: it is a draft with fewer tokens, the
                # rest of what was proposed goes unverified.
                drafts = self.set_drafts(request, drafts[: budget - num_new], request.num_proposed_drafts)
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
        finished, self._finished = self._finished, []
        cut, self._cut = self._cut, []
        return SchedulerOutput.of(scheduled, preempted, finished, cut)

    def _scheduled(self, request: Request, num_new: int, admitted: bool = False) -> ScheduledRequest:
        """Schedule ``num_new`` tokens of a request that holds blocks for them; the blocks they fill are
        cached now, so a request admitted later in this step can already share them."""
        start = request.num_computed_tokens
        self.kv_cache.cache_blocks(request, start + num_new)
        captures = self.kv_cache.plan_state_captures(request, start, num_new)
        return ScheduledRequest.of(request, num_new, admitted, captures)

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
        self.set_drafts(request, ())  # never verified, so never counted
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)

    def set_drafts(
        self, request: Request, drafts: tuple[int, ...], num_proposed: int | None = None
    ) -> tuple[int, ...]:
        """Give ``request`` the drafts its next step verifies (() for none), the first of the ``num_proposed``
        its drafter proposed for the round (None: those given, all verified); the one writer of them."""
        request.spec_token_ids = drafts
        request.num_proposed_drafts = len(drafts) if num_proposed is None else num_proposed
        return drafts

    def drop_drafts(self) -> None:
        """Forget every request's drafts (the drafter that proposed them is gone: never verified, never
        counted)."""
        for request in (*self.running, *self.waiting):
            self.set_drafts(request, ())

    def update_from_output(self, decided: SchedulerOutput, output: ModelRunnerOutput) -> list[RequestUpdate]:
        """Book one step: append each sampling request's tokens until one stops it (a stop token, then
        max_tokens or the model length), keep its logprobs, advance its grammar, commit the KV the step
        verified and free the blocks of rejected drafts; finish the requests that ended. One update per
        scheduled request, in order."""
        sampled = iter(zip(output.sampled, output.logprobs, strict=True))
        updates = []
        for s in decided.scheduled:
            request = s.request
            if s.state_captures:
                self.kv_cache.commit_state_captures(request, s.state_captures)
            block_ids = request.block_ids
            num_valid = s.num_new_tokens  # tokens whose KV is now valid
            num_kept = num_accepted = 0
            refused = False
            if s.samples:
                tokens, logprobs = next(sampled)
                num_accepted = len(tokens) - 1
                num_valid += num_accepted
                num_kept, ended = self._append(request, tokens)
                if request.grammar is not None and not request.grammar.advance(tokens[:num_kept]):
                    refused = True
                if logprobs is not None and request.unsent_logprobs is not None:
                    request.unsent_logprobs.extend(logprobs[:num_kept])
                self.set_drafts(request, ())  # verified now (and counted by the caller)
                if ended is not None:
                    block_ids = list(block_ids)  # finishing frees them
                    self.finish(request, *ended)
            request.num_computed_tokens = s.start + num_valid
            # An ended request's blocks are all freed already.
            if not request.status.is_finished and self.kv_cache.trim(request, request.num_computed_tokens):
                self._cut.append(request)
            accepted = min(num_kept, num_accepted)
            updates.append(RequestUpdate(s, num_valid, num_kept, accepted, refused, block_ids))
        return updates

    def _append(self, request: Request, tokens: list[int]) -> tuple[int, _Ending | None]:
        """Append tokens until one stops the request (a stop token, then max_tokens or the model length,
        checked in that order after each token): how many were appended, and how it ends if it does."""
        room = request.token_limit - len(request.all_token_ids)
        stop_ids = request.stop_ids
        if len(tokens) < room and stop_ids.isdisjoint(tokens):
            request.all_token_ids += tokens
            return len(tokens), None
        for i, token in enumerate(tokens):
            stopped = token in stop_ids
            if stopped or i + 1 >= room:
                request.all_token_ids += tokens[: i + 1]
                if stopped:
                    return i + 1, (RequestStatus.FINISHED_STOPPED, FinishReason("stop", stop_token_id=token))
                return i + 1, (RequestStatus.FINISHED_LENGTH, None)
        raise AssertionError("unreachable: a token stops the request or it has room for all of them")

    def finish(self, request: Request, status: RequestStatus, reason: FinishReason | None = None) -> None:
        """Take an ended request out of the queues, free its blocks and say why it ended (``reason``, or the
        status's own)."""
        assert status.is_finished
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        elif request in self.waiting:  # not there while its grammar compiles
            self.waiting.remove(request)
        request.status = status
        if request.finish is None:
            request.finish = reason or status.finish_reason
        self.kv_cache.free(request)
        self._finished.append(request)
