"""What the scheduler decided for one step, frozen when decided: who runs, how many tokens, which drafts, and
the layout every reader of the step's rows shares (the runner's logits and hidden states, the sampler); and
what ``update_from_output`` booked of it, per request, for the drafter and the outputs."""

from __future__ import annotations

from typing import NamedTuple

from openinfer.engine_core.request import Request


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
    # the drafts proposed for the round spec_token_ids verify (>= their number; the rest go unverified)
    num_proposed: int = 0
    # a hybrid model's prefix states this step keeps: (position, prefix state slot), the state after
    # token position - 1 (one of the new tokens, never a draft)
    state_captures: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(
        cls,
        request: Request,
        num_new_tokens: int,
        admitted: bool = False,
        state_captures: tuple[tuple[int, int], ...] = (),
    ) -> ScheduledRequest:
        """Schedule `num_new_tokens` of `request` and, when they complete it, its pending drafts."""
        samples = request.num_computed_tokens + num_new_tokens == request.num_tokens
        drafts = request.spec_token_ids if samples else ()
        proposed = request.num_proposed_drafts if samples else 0
        start = request.num_computed_tokens
        return cls(request, start, num_new_tokens, drafts, samples, admitted, proposed, state_captures)

    @property
    def num_tokens(self) -> int:
        """The request's tokens when it was scheduled, when it samples (all of them are run by then)."""
        return self.start + self.num_new_tokens

    @property
    def num_output_tokens(self) -> int:
        """Its output tokens when it was scheduled, when it samples: row j of its logits samples output token
        ``num_output_tokens + j``."""
        return self.num_tokens - self.request.num_prompt_tokens

    @property
    def token_ids(self) -> list[int]:
        """The tokens run this step: the new ones, then the drafts."""
        return [
            *self.request.all_token_ids[self.start : self.start + self.num_new_tokens],
            *self.spec_token_ids,
        ]


class SchedulerOutput(NamedTuple):
    """One step's decision and its row layout, computed once here.

    The runner runs ``scheduled`` in order, token after token (``token_starts``), and returns logits for
    ``sampling`` only: request i of ``sampling`` has ``len(drafts) + 1`` rows from ``logits_starts[i]`` on
    (its last new token, then each draft). ``finished`` and ``cut`` tell the worker's persistent rows what
    changed since the last step: requests that ended (their rows are free), and requests whose block table
    the KV manager cut short (a grown table may then hold other blocks at the same length).
    """

    scheduled: list[ScheduledRequest]
    preempted: list[Request]
    finished: list[Request]
    cut: list[Request]
    sampling: list[ScheduledRequest]  # the scheduled requests that sample, in order
    logits_starts: list[int]  # (len(sampling),): each sampling request's first logits row
    token_starts: list[int]  # (len(scheduled),): each scheduled request's first token row
    num_logits: int  # logits rows in all
    num_tokens: int  # tokens run in all, drafts included

    @classmethod
    def of(
        cls,
        scheduled: list[ScheduledRequest],
        preempted: list[Request] | None = None,
        finished: list[Request] | None = None,
        cut: list[Request] | None = None,
    ) -> SchedulerOutput:
        sampling: list[ScheduledRequest] = []
        logits_starts: list[int] = []
        token_starts: list[int] = []
        num_logits = num_tokens = 0
        for s in scheduled:  # one pass: a step's layout costs little next to its scheduling
            token_starts.append(num_tokens)
            num_drafts = len(s.spec_token_ids)
            num_tokens += s.num_new_tokens + num_drafts
            if s.samples:
                sampling.append(s)
                logits_starts.append(num_logits)
                num_logits += num_drafts + 1
        return cls(
            scheduled, preempted or [], finished or [], cut or [], sampling, logits_starts, token_starts,
            num_logits, num_tokens,
        )  # fmt: skip

    @property
    def drafts(self) -> list[tuple[int, ...]]:
        """The drafts each sampling request verifies, in order."""
        return [s.spec_token_ids for s in self.sampling]


class RequestUpdate(NamedTuple):
    """What the step did to one scheduled request, as ``update_from_output`` booked it."""

    scheduled: ScheduledRequest
    num_valid: int  # tokens from scheduled.start on whose KV is verified now (new tokens, accepted drafts)
    num_kept: int  # tokens appended (0: it did not sample); a stop cuts the rest
    num_accepted: int  # draft tokens accepted and kept (an accepted run cut by a stop counts up to it)
    grammar_refused: bool  # its grammar refused a kept token (other options forced it): it must end
    block_ids: list[int]  # its block table as the step ran (a copy for a request that ended: it holds none)
