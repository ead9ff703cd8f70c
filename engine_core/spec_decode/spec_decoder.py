"""The engine's speculative-decoding state: the loaded drafter, its counters, its context record and the spec
log."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from openinfer.engine_core.config import DrafterSpec, SpecMethod
from openinfer.engine_core.request import Request
from openinfer.engine_core.scheduler_output import RequestUpdate, SchedulerOutput
from openinfer.engine_core.spec_decode.adaptive import (
    EXPLORE_EVERY,
    StepCosts,
    confidence_survival,
    counter_survival,
    verify_lengths,
)
from openinfer.engine_core.spec_decode.context_blocks import ContextBlocks
from openinfer.engine_core.spec_decode.draft_numbers import NonFiniteLog
from openinfer.engine_core.spec_decode.drafter import (
    DeviceDrafter,
    DeviceQueries,
    DraftQuery,
)
from openinfer.engine_core.spec_decode.drafter_loaders import DRAFTERS
from openinfer.engine_core.spec_decode.drafting_policy import DraftingPolicy
from openinfer.engine_core.spec_decode.pending_context import PendingContext, step_rows
from openinfer.engine_core.spec_decode.spec_log import SpecLog
from openinfer.engine_core.worker.executor import ModelExecutor
from openinfer.engine_core.worker.runner_output import DeviceDrafts
from openinfer.engine_core.worker.step_batch import StepBatch
from openinfer.kernels.host_copy import host_to_device
from openinfer.kernels.verification import Verified
from openinfer.protocol import SpecDecodeCounters


class SpecDecoder:
    """One loaded drafter, built complete: its cumulative counters of K (docs/design.md, counter semantics), and,
    for a drafter that reads the target's hidden states (DFlash), its own record of whose context it holds.

    The worker calls ``draft_on_device`` before the step's one read-back (the drafter takes the new context
    and, DFlash, proposes from the device tokens); the engine calls ``after_step`` once the step is booked,
    then ``propose`` for the requests it may draft for; a new drafter plugs in through ``DRAFTERS``.
    """

    def __init__(self, spec: DrafterSpec, runner: ModelExecutor, log: SpecLog | None) -> None:
        self.counters = SpecDecodeCounters.zero(spec.num_spec_tokens)  # refuses K outside [1, 32] first
        if spec.method not in set(SpecMethod):
            choices = ", ".join(SpecMethod)
            raise ValueError(f"unknown --spec-method {spec.method!r}; choose one of {choices}")
        self.drafter = DRAFTERS[SpecMethod(spec.method)](spec, runner)
        self.num_spec_tokens = spec.num_spec_tokens
        self.confidence_threshold = spec.confidence_threshold  # > 0 only for a drafter that rates its drafts
        self.adaptive_verification = spec.adaptive_verification
        # the engine's step costs (measured at start, refreshed every step), for adaptive verification
        self.step_costs: StepCosts | None = None
        # with adaptive verification, whether proposing pays, measured step by step (drafting_policy.py)
        self.drafting = DraftingPolicy() if spec.adaptive_verification else None
        self._proposed = False  # whether this step's drafter proposed for anyone
        self._log = log
        # A drafter that reads hidden states can draft only for requests whose whole context it has seen (those
        # admitted since it loaded), and a cached block serves it only if it wrote that block's context.
        self._whole_context: set[Request] = set()
        self._context_blocks = ContextBlocks(runner.block_size)
        self.pending_context = PendingContext(self.drafter)  # paused steps' context, not yet written
        # The step's plan, made before its read-back (can_draft, evaluated once per step): per scheduled
        # request whether it may draft, and the sampling ones that propose after it, in order.
        self._may_draft: list[bool] = []
        self._proposers: list[Request] = []
        # The confidences of each pending round's verified drafts (a drafter that rates them), until counted.
        self._rated: dict[Request, list[float]] = {}
        # the last step's device drafts' distributions (sampled drafting), one row per proposer
        self._draft_probs: Tensor | None = None
        self._left_out = 0  # rounds adaptive verification verified none of (counter-estimated drafters)
        # DFlash proposes on the device before the read-back; n-gram on the host after it.
        self._on_device = self.drafter if isinstance(self.drafter, DeviceDrafter) else None
        # its rows of NaN/inf numbers, logged naming its folder
        self._non_finite = NonFiniteLog(str(spec.draft_model or self.drafter.describe()))

    def describe(self) -> str:
        threshold = self.confidence_threshold
        adaptive = " adaptive-verification" if self.adaptive_verification else ""
        return (
            self.drafter.describe() + (f" confidence-threshold={threshold:g}" if threshold else "") + adaptive
        )

    @property
    def aux_layer_ids(self) -> tuple[int, ...]:
        """The target layers whose hidden states the drafter reads; () when none."""
        return self.drafter.aux_layer_ids

    @property
    def hit_filter(self) -> Callable[[int], bool] | None:
        """For the KV manager: which cached blocks may serve a hit (None: every one, the drafter reads no
        context of its own)."""
        return self._context_blocks.holds if self.aux_layer_ids else None

    def continue_counting(self, previous: SpecDecoder | None) -> None:
        """Counters are cumulative per incarnation and K: a replacement of the same K counts on."""
        if previous is not None and previous.num_spec_tokens == self.num_spec_tokens:
            self.counters = previous.counters

    def can_draft(self, request: Request) -> bool:
        """Whether this drafter may propose for ``request`` (its stats K and context fit this drafter)."""
        counters = request.spec_counters
        if counters is not None and counters.num_spec_tokens != self.num_spec_tokens:
            return False
        return not self.aux_layer_ids or request in self._whole_context

    def draft_on_device(
        self, decided: SchedulerOutput, verified: Verified | None, aux: Tensor | None, step: StepBatch
    ) -> DeviceDrafts | None:
        """Before the step's read-back (the worker calls it): note who may draft after this step, write the
        drafter's context at every position the target ran for them (``aux``: the target's hidden states at
        every token run, rows at ``decided.token_starts``, at the positions and KV slots ``step`` ran them;
        rejected positions too, see ``DFlashDrafter``), and let a device drafter propose from the step's
        device tokens (``verified``): (P, K) drafts, one row per request of ``self._proposers``; None when the
        drafter proposes on the host."""
        reads_context = bool(self.aux_layer_ids)
        for request in decided.finished:
            self._whole_context.discard(request)
            self._rated.pop(request, None)
        self._may_draft = []
        self._proposers = []
        picked: list[int] = []  # sampling index of each proposer
        rows: list[tuple[int, int]] = []  # the step's token rows (start, stop) of the requests that draft
        num_sampling = 0
        for s, row in zip(decided.scheduled, decided.token_starts, strict=True):
            request = s.request
            if reads_context and s.admitted:
                self._whole_context.add(request)  # its context from s.start on is computed now, the rest hit
            drafts = self.can_draft(request)  # evaluated once per step, here
            self._may_draft.append(drafts)
            if drafts and s.samples:
                self._proposers.append(request)
                picked.append(num_sampling)
            num_sampling += s.samples
            if drafts and reads_context and aux is not None:
                rows.append((row, row + s.num_new_tokens + len(s.spec_token_ids)))
        proposing = self.drafting is None or self.drafting.choose(len(decided.scheduled))
        if not proposing:
            self._proposers, picked = [], []  # proposing does not pay now: no drafts after this step
        context = step_rows(aux, step, rows) if rows and aux is not None else None
        self.pending_context.write(context, now=proposing)
        self._proposed = bool(picked)
        self._draft_probs = None
        if self._on_device is None or verified is None or not picked:
            return None
        proposed = self._on_device.propose_on_device(self._device_queries(decided, verified, picked))
        self._draft_probs = proposed.probs  # stays on the device until the rounds are verified
        return proposed

    def observe_step(self, decided: SchedulerOutput, num_tokens: int, seconds: float) -> None:
        """The whole step (``seconds``, ``num_tokens`` output tokens) for the drafting policy: a decode step
        (every request one new token, drafts aside) tells it the rate of its mode."""
        if self.drafting is None or not decided.scheduled:
            return
        if any(not s.samples or s.num_new_tokens != 1 for s in decided.scheduled):
            return  # prefill in it: its time is not a decode's
        verified = any(s.spec_token_ids for s in decided.scheduled)
        self.drafting.observe(self._proposed, verified, num_tokens, seconds)

    def _device_queries(
        self, decided: SchedulerOutput, verified: Verified, picked: list[int]
    ) -> DeviceQueries:
        """The proposers' queries, from the step's device tokens: each one's current token is the target's
        token after its accepted drafts, its position start + new tokens + accepted, and its max_drafts
        (``query``'s room, as it will be once the step is booked) the room before the step minus them."""
        device = verified.tokens.device
        index = host_to_device(picked, torch.int64, device)  # (P,)
        sampling = [decided.sampling[i] for i in picked]
        accepted = verified.accepted()[index]  # (P,)
        # Per proposer: its tokens when scheduled, and the room (query's) once it appends a + 1 tokens is
        # token_limit - (tokens + a + 1) - 1.
        host = [s.start + s.num_new_tokens for s in sampling] + [
            s.request.token_limit - s.start - s.num_new_tokens - 2 for s in sampling
        ]
        before, room = host_to_device(host, torch.int64, device).view(2, len(picked))  # (P,) each
        temperatures = [s.request.temperature for s in sampling]
        sampled = any(temperatures)
        return DeviceQueries(
            current_tokens=verified.tokens[index, accepted],
            positions=before + accepted,
            max_drafts=torch.clamp(room - accepted, 0, self.num_spec_tokens),
            block_ids=[s.request.block_ids for s in sampling],
            temperatures=host_to_device(temperatures, torch.float32, device) if sampled else None,
            generators=[s.request.generator for s in sampling] if sampled else None,
        )

    def after_step(self, decided: SchedulerOutput, updates: list[RequestUpdate]) -> None:
        """Once the scheduler booked the step: record which full blocks hold the drafter's context (the
        verified positions of the requests that go on and may draft; the target wrote every position run)."""
        if not self.aux_layer_ids:
            return
        for update, may_draft in zip(updates, self._may_draft, strict=True):
            s = update.scheduled
            end = s.start + s.num_new_tokens + len(s.spec_token_ids)
            # A request that ended hands the drafter nothing.
            drafts = may_draft and not s.request.status.is_finished
            written = s.start + update.num_valid if drafts else s.start
            self._context_blocks.target_wrote(update.block_ids, written, end)
            if drafts:
                self._context_blocks.drafter_wrote(update.block_ids, s.start, written)

    def propose(
        self,
        draft_ids: list[list[int]],
        confidence: list[list[float]] | None = None,
        base_tokens: int = 0,
        finite: list[bool] | None = None,
    ) -> list[tuple[Request, tuple[int, ...], int]]:
        """The rounds to verify next, ``(request, drafts, P)``, for every request that sampled in the last
        step, goes on and may draft: its P proposed drafts (a device drafter's ``draft_ids``, one row per
        proposer read back with the step, cut to its max_drafts; or one host drafter call), of which the
        first V are verified: all of them; those before the first confidence below the threshold
        (``verify_length``); with adaptive verification, the step's best budget (``adaptive.py``; the next
        step runs about ``base_tokens`` tokens besides the drafts). A round verifying none of its drafts is
        counted here as unverified and not returned. ``finite``: per row of ``draft_ids``, whether the drafter's
        numbers were (rows that were not have confidence 0; logged at a bounded rate)."""
        if finite:
            self._non_finite.note(finite)
        requests, queries, rows = [], [], []
        for p, request in enumerate(self._proposers):
            if not request.status.is_finished:  # one that stopped has its drafts dropped
                query = self.query(request)
                if query.max_drafts > 0:
                    requests.append(request)
                    queries.append(query)
                    rows.append(p)
        self._proposers = []
        if not queries:
            return []
        if self._on_device is not None:
            drafts = [draft_ids[p][: q.max_drafts] for p, q in zip(rows, queries, strict=True)]
        else:
            drafts = self.drafter.propose(queries)
        rated = [confidence[p][: len(d)] for p, d in zip(rows, drafts, strict=True)] if confidence else None
        lengths = [len(d) for d in drafts]
        if rated is not None and self.confidence_threshold:
            lengths = [self.verify_length(c) for c in rated]
        if self.adaptive_verification and self.step_costs is not None:
            survival = [
                confidence_survival(rated[i][:n])
                if rated is not None
                else counter_survival(self.counters, request.spec_counters, n)
                for i, (request, n) in enumerate(zip(requests, lengths, strict=True))
            ]
            contexts = [request.num_computed_tokens for request in requests]  # what each verify attends to
            lengths = verify_lengths(survival, self.step_costs, max(base_tokens, len(requests)), contexts)
            if rated is None:
                lengths = self._explore(lengths, [len(d) for d in drafts])
        rounds = []
        probs, self._draft_probs = self._draft_probs, None
        for i, (request, proposed, verified) in enumerate(zip(requests, drafts, lengths, strict=True)):
            if verified:
                rounds.append((request, tuple(proposed[:verified]), len(proposed)))
                request.spec_probs = None if probs is None else probs[rows[i], :verified]
                if rated is not None:
                    self._rated[request] = rated[i][:verified]
            elif proposed:
                self.observe_unverified(request, len(proposed))
        return rounds

    def _explore(self, lengths: list[int], proposed: list[int]) -> list[int]:
        """Acceptance estimated from the counters learns only from verified drafts: every EXPLORE_EVERY-th
        round the budget leaves out is verified whole, so that a drafter written off early is measured
        again."""
        explored = []
        for verified, n in zip(lengths, proposed, strict=True):
            if verified == 0 and n > 0:
                self._left_out += 1
                verified = n if self._left_out % EXPLORE_EVERY == 0 else 0
            explored.append(verified)
        return explored

    def verify_length(self, confidence: list[float]) -> int:
        """DeepSpec's rule for how many of a round's drafts the target verifies: those before the first whose
        confidence is below ``--confidence-threshold`` (each draft's own, not the prefix's product)."""
        threshold = self.confidence_threshold
        return next((k for k, c in enumerate(confidence) if c < threshold), len(confidence))

    def query(self, request: Request) -> DraftQuery:
        """Drafts never run past max_tokens or the model length (``token_limit``): the bonus token always
        comes on top."""
        tokens = request.all_token_ids
        room = request.token_limit - len(tokens) - 1
        return DraftQuery(
            tokens[-1], len(tokens) - 1, request.block_ids, max(0, min(self.num_spec_tokens, room)), tokens
        )

    def observe(
        self,
        request: Request,
        num_draft_tokens: int,
        num_accepted: int,
        num_proposed: int | None = None,
        confidence: Sequence[float] | None = None,
    ) -> None:
        """Count one verified draft in the engine counters, the request's stats and the spec log:
        ``num_draft_tokens`` (V >= 1) verified, ``num_accepted`` of them accepted, of ``num_proposed`` (P)
        the drafter proposed; None: all of them were verified (P = V). The P - V tokens left out count as
        unverified, never as rejected. ``confidence``: the confidence head's c_i for each of the V verified
        tokens (in [0, 1]); None: those ``propose`` kept for the round (the first V: the token budget may
        have cut it since), or none from a drafter without a confidence head. ``ValueError`` before anything
        moves when the draft or its confidences cannot be."""
        rated = self._rated.pop(request, None)
        if confidence is None and rated is not None:
            confidence = rated[:num_draft_tokens]
        proposed = num_draft_tokens if num_proposed is None else num_proposed
        num_unverified = proposed - num_draft_tokens
        self.counters.observe_draft(num_draft_tokens, num_accepted, num_unverified, confidence)
        self._request_counters(request).observe_draft(
            num_draft_tokens, num_accepted, num_unverified, confidence
        )
        if self._log is not None:
            self._log.write(
                request.request_id, self.num_spec_tokens, num_draft_tokens, num_accepted, proposed, confidence
            )

    def observe_unverified(self, request: Request, num_proposed: int) -> None:
        """Count a round whose ``num_proposed`` tokens (>= 1) the scheduler verified none of (V = 0): no draft;
        the tokens count as unverified, and the spec log gets a line with ``num_draft_tokens`` 0."""
        self._rated.pop(request, None)
        self.counters.observe_unverified(num_proposed)
        self._request_counters(request).observe_unverified(num_proposed)
        if self._log is not None:
            self._log.write(request.request_id, self.num_spec_tokens, 0, 0, num_proposed)

    def _request_counters(self, request: Request) -> SpecDecodeCounters:
        """The request's own tally of the same rounds (made at its first round)."""
        if request.spec_counters is None:
            request.spec_counters = SpecDecodeCounters.zero(self.num_spec_tokens)
        return request.spec_counters
