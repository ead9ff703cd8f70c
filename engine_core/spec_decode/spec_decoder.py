"""The engine's speculative-decoding state: the loaded drafter, its counters, its context record and the spec
log."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from openinfer.engine_core.config import DrafterSpec, SpecMethod
from openinfer.engine_core.core.request import Request
from openinfer.engine_core.core.scheduler import RequestUpdate
from openinfer.engine_core.core.scheduler_output import SchedulerOutput
from openinfer.engine_core.spec_decode.context_blocks import ContextBlocks
from openinfer.engine_core.spec_decode.drafter import ContextUpdate, Drafter, DraftQuery
from openinfer.engine_core.spec_decode.ngram import NgramDrafter
from openinfer.engine_core.spec_decode.spec_log import SpecLog
from openinfer.engine_core.worker.executor import ModelExecutor
from openinfer.protocol import SpecDecodeCounters


def _load_ngram(spec: DrafterSpec, runner: ModelExecutor) -> Drafter:
    return NgramDrafter(spec.num_spec_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max)


def _load_dflash(spec: DrafterSpec, runner: ModelExecutor) -> Drafter:
    from openinfer.engine_core.models.dflash_config import AnchorLayout
    from openinfer.engine_core.spec_decode.dflash import DFlashDrafter
    from openinfer.engine_core.worker.model_runner import ModelRunner

    if spec.draft_model is None:
        raise ValueError("--spec-method dflash needs --draft-model PATH (a DFlash checkpoint folder)")
    if not isinstance(runner, ModelRunner):  # DFlash shares the target's embedding and LM head
        raise ValueError("--fake-model has no hidden states for DFlash; use --spec-method ngram")
    anchor = AnchorLayout(spec.dflash_anchor) if spec.dflash_anchor else None
    return DFlashDrafter(spec.draft_model, runner, spec.num_spec_tokens, anchor)


DRAFTERS = {SpecMethod.NGRAM: _load_ngram, SpecMethod.DFLASH: _load_dflash}


class SpecDecoder:
    """One loaded drafter, built complete: its cumulative counters of K (DESIGN.md, counter semantics), and,
    for a drafter that reads the target's hidden states (DFlash), its own record of whose context it holds.

    The engine calls ``after_step`` with each step's decision and output (the drafter takes the new context),
    then ``propose`` for the requests it may draft for; a new drafter plugs in through ``DRAFTERS``.
    """

    def __init__(self, spec: DrafterSpec, runner: ModelExecutor, log: SpecLog | None) -> None:
        self.counters = SpecDecodeCounters.zero(spec.num_spec_tokens)  # refuses K outside [1, 32] first
        if spec.method not in set(SpecMethod):
            choices = ", ".join(SpecMethod)
            raise ValueError(f"unknown --spec-method {spec.method!r}; choose one of {choices}")
        self.drafter = DRAFTERS[SpecMethod(spec.method)](spec, runner)
        self.num_spec_tokens = spec.num_spec_tokens
        self._log = log
        # A drafter that reads hidden states can draft only for requests whose whole context it has seen (those
        # admitted since it loaded), and a cached block serves it only if it wrote that block's context.
        self._whole_context: set[Request] = set()
        self._context_blocks = ContextBlocks(runner.block_size)
        self._drafting: list[Request] = []  # may draft after the step (can_draft, evaluated once per step)

    def describe(self) -> str:
        return self.drafter.describe()

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

    def after_step(self, decided: SchedulerOutput, updates: list[RequestUpdate], aux: Tensor | None) -> None:
        """Take the step's new context (``aux``, the target's hidden states at every token run, rows at
        ``decided.token_starts``) for each request that goes on, and note who may draft next: called once per
        step, after the scheduler booked it."""
        reads_context = bool(self.aux_layer_ids)
        for request in decided.finished:
            self._whole_context.discard(request)
        self._drafting = []
        context: list[ContextUpdate] = []
        for update, row in zip(updates, decided.token_starts, strict=True):
            s = update.scheduled
            request = s.request
            if reads_context and s.admitted:
                self._whole_context.add(request)  # its context from s.start on is computed now, the rest hit
            # A request that ended hands the drafter nothing (can_draft is evaluated once per step, here).
            drafts = not request.status.is_finished and self.can_draft(request)
            if drafts and s.samples:
                self._drafting.append(request)
            if not reads_context:
                continue
            # The target wrote its KV at every position run; the verified ones get context when it drafts.
            end = s.start + s.num_new_tokens + len(s.spec_token_ids)
            written = s.start + update.num_valid if drafts else s.start
            self._context_blocks.target_wrote(update.block_ids, written, end)
            if drafts and aux is not None:
                hidden = aux[row : row + update.num_valid]
                context.append(ContextUpdate(update.block_ids, s.start, hidden))
                self._context_blocks.drafter_wrote(update.block_ids, s.start, written)
        if context:
            self.drafter.extend_context(context)

    def propose(self, max_model_len: int) -> list[tuple[Request, tuple[int, ...]]]:
        """Drafts for every request that sampled in the last step, goes on and may draft: one drafter call."""
        requests, queries = [], []
        for request in self._drafting:
            if not request.status.is_finished:
                query = self.query(request, max_model_len)
                if query.max_drafts > 0:
                    requests.append(request)
                    queries.append(query)
        self._drafting = []
        if not queries:
            return []
        return [(r, tuple(d)) for r, d in zip(requests, self.drafter.propose(queries), strict=True)]

    def query(self, request: Request, max_model_len: int) -> DraftQuery:
        """Drafts never run past max_tokens or the model length: the bonus token always comes on top."""
        params = request.sampling_params
        room = min(params.max_tokens - request.num_output_tokens, max_model_len - request.num_tokens) - 1
        return DraftQuery(
            request.all_token_ids[-1],
            request.num_tokens - 1,
            request.block_ids,
            max(0, min(self.num_spec_tokens, room)),
            request.all_token_ids,
        )

    def observe(self, request: Request, num_draft_tokens: int, num_accepted: int) -> None:
        """Count one verified draft in the engine counters, the request's stats and the spec log."""
        self.counters.observe_draft(num_draft_tokens, num_accepted)
        if request.spec_counters is None:
            request.spec_counters = SpecDecodeCounters.zero(self.num_spec_tokens)
        request.spec_counters.observe_draft(num_draft_tokens, num_accepted)  # the same tally, per request
        if self._log is not None:
            self._log.write(request.request_id, self.num_spec_tokens, num_draft_tokens, num_accepted)
