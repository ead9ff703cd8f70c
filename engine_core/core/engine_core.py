"""The engine core: one step is schedule -> execute -> update."""

from __future__ import annotations

import logging
import time

import torch
from torch import Tensor

from openinfer.engine_core.config import DrafterSpec, EngineConfig
from openinfer.engine_core.core.kv_cache_manager import KVCacheManager
from openinfer.engine_core.core.request import Request, RequestStatus
from openinfer.engine_core.core.request_checks import refusal
from openinfer.engine_core.core.scheduler import ScheduledRequest, Scheduler
from openinfer.engine_core.process.runtime_facts import RuntimeFacts
from openinfer.engine_core.sample.logits_plan import processed_logits
from openinfer.engine_core.sample.step_logprobs import sampled_logprobs
from openinfer.engine_core.sample.structured_output import GrammarCompilers, GrammarQueue, apply_grammars
from openinfer.engine_core.spec_decode.drafter import ContextUpdate
from openinfer.engine_core.spec_decode.spec_decoder import SpecDecoder
from openinfer.engine_core.spec_decode.spec_log import SpecLog
from openinfer.engine_core.worker.executor import ModelExecutor
from openinfer.engine_core.worker.input_batch import InputBatch
from openinfer.kernels.sampling import SamplingBatch
from openinfer.kernels.verification import verify
from openinfer.protocol import EngineCoreOutput, EngineCoreRequest, FinishReason, LoadSnapshot

logger = logging.getLogger(__name__)

_FINISH_KIND = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


_NO_ALLOWED_TOKEN = "the other sampling options leave no token the structured output allows"


class EngineCore:
    """Requests in, token outputs out; owns the scheduler and the KV cache, and steps the runner it is given
    (the engine process chooses the real one or ``--fake-model``'s)."""

    def __init__(self, config: EngineConfig, runner: ModelExecutor, incarnation: int = 0) -> None:
        self.config = config
        self.incarnation = incarnation
        self.runner = runner
        self.facts = RuntimeFacts.found(config, runner)
        facts = self.facts
        self.kv_cache = KVCacheManager(facts.num_kv_blocks, facts.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.kv_cache, config.max_num_seqs, config.max_num_batched_tokens)
        # Drafts never run past the model length, so a row holds max_model_len tokens.
        self.input_batch = InputBatch(config.max_num_seqs, self.facts.max_model_len, self.facts.block_size)
        self.requests: dict[str, Request] = {}
        # Requests whose grammar is compiling (the compiler is built for the first one)
        tokenizer_json = config.model_path / "tokenizer.json"
        self.grammars = GrammarQueue(GrammarCompilers(tokenizer_json, facts.vocab_size, facts.eos_token_ids))
        self._ended: list[EngineCoreOutput] = []  # outputs of requests ended outside a step
        # Requests without a seed of their own draw from this one (no global RNG state).
        self.generator = torch.Generator(device=runner.device).manual_seed(config.seed)
        self.spec_log = (
            SpecLog(config.spec_log, config.engine_index, incarnation) if config.spec_log else None
        )
        self.spec: SpecDecoder | None = None
        self._num_drafter_loads = 0
        if config.speculative is not None:
            self.load_drafter(config.speculative)

    # ---- speculative decoding -----------------------------------------------------------------------

    def load_drafter(self, spec: DrafterSpec) -> str:
        """Build and install a drafter now (at start, and in tests); see :meth:`install_drafter`."""
        return self.install_drafter(self.build_drafter(spec))

    def build_drafter(self, spec: DrafterSpec) -> SpecDecoder:
        """Load a drafter's weights without touching the running state (safe in a background thread)."""
        return SpecDecoder(spec, self.runner, self.spec_log)

    def install_drafter(self, loaded: SpecDecoder) -> str:
        """Make ``loaded`` the drafter.

        Counters are cumulative per incarnation and K (DESIGN.md): a replacement with the same K keeps
        counting in the same counters; a new K, or a load after none, starts from zero.
        """
        self._num_drafter_loads += 1
        loaded.generation = self._num_drafter_loads
        if self.spec is not None and self.spec.num_spec_tokens == loaded.num_spec_tokens:
            loaded.counters = self.spec.counters
        self._drop_drafts()
        self.spec = loaded
        # Cached blocks are hits for it only where it wrote the drafter context itself (if it reads any).
        self.kv_cache.context_generation = loaded.generation if loaded.drafter.aux_layer_ids else None
        logger.info("drafter loaded: %s", loaded.describe())
        return loaded.describe()

    def unload_drafter(self) -> None:
        """Turn speculation off; counters are gone (a later drafter starts from zero)."""
        self._drop_drafts()
        self.spec = None
        self.kv_cache.context_generation = None
        logger.info("drafter unloaded")

    def fail_running(self, message: str) -> list[EngineCoreOutput]:
        """End every running request with an error (a step failed); waiting requests go on, and no block the
        step may have written stays cached."""
        self.kv_cache.reset()
        outputs = []
        for request in list(self.scheduler.running):
            request.finish = FinishReason("error", message=message)
            self._finish(request, RequestStatus.FINISHED_ERROR)
            outputs.append(request.take_output())
        return outputs

    def _drop_drafts(self) -> None:
        # Drafts not yet verified belong to the old drafter: dropped, never counted.
        for request in self.requests.values():
            request.spec_token_ids = ()

    # ---- inputs -------------------------------------------------------------------------------------

    def add_request(self, message: EngineCoreRequest) -> None:
        """Queue a request, or end it at once with an error output saying what was wrong with it."""
        error = refusal(message, self.facts, self.kv_cache)
        if message.request_id in self.requests:
            error = f"request id {message.request_id!r} is already running on this engine"
        if error is not None:
            logger.warning("request %s refused: %s", message.request_id, error)
            finish = FinishReason("error", message=error, bad_request=True)
            self._ended.append(EngineCoreOutput(message.request_id, [], finish))
            return
        params = message.sampling_params
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=self.runner.device).manual_seed(params.seed)
        stop_ids = set(params.stop_token_ids) | (
            set() if params.ignore_eos else set(self.facts.eos_token_ids)
        )
        request = Request(
            message.request_id,
            list(message.prompt_token_ids),
            params,
            message.arrival_time or time.time(),
            min(len(message.prompt_token_ids) + params.max_tokens, self.facts.max_model_len),
            generator=generator,
            stop_ids=frozenset(stop_ids),
        )
        self.requests[request.request_id] = request
        if params.structured_outputs is None:
            self.scheduler.add(request)
        else:  # it joins the scheduler's queue when its grammar is compiled
            self.grammars.add(request, params.structured_outputs)

    def _admit_compiled(self) -> None:
        """Queue the requests whose grammar is ready; end those whose constraint does not compile."""
        if not self.grammars:
            return
        if not self.scheduler.has_work:  # nothing else to do: wait a little for a compilation
            self.grammars.wait(0.005)
        for request, error in self.grammars.take_ready():
            if error is None:
                self.scheduler.add(request)
            else:
                self._ended.append(self._refuse(request, error))

    def _refuse(self, request: Request, message: str) -> EngineCoreOutput:
        """End a request for what it asked (a client's error), and give its last output."""
        logger.warning("request %s refused: %s", request.request_id, message)
        request.finish = FinishReason("error", message=message, bad_request=True)
        self._finish(request, RequestStatus.FINISHED_ERROR)
        return request.take_output()

    def abort(self, request_ids: list[str]) -> None:
        """End these requests now (unknown or already ended ids are ignored)."""
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is not None:
                self._finish(request, RequestStatus.FINISHED_ABORTED)
                self._ended.append(request.take_output())

    # ---- the step -----------------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work or bool(self.grammars)

    def step(self) -> list[EngineCoreOutput]:
        """Run one model step over the scheduled requests and return what changed for the frontend (the
        outputs of requests ended since the last step first; a step that raises keeps them for the next)."""
        self._admit_compiled()
        decided = self.scheduler.schedule()
        for request in decided.preempted:
            self.input_batch.remove(request)
        scheduled = decided.scheduled
        outputs = []
        if scheduled:
            logits, aux = self._execute(scheduled)
            outputs = self._update(scheduled, logits, aux)
            self._propose(scheduled)
        if self.spec_log is not None:
            self.spec_log.flush()
        ended, self._ended = self._ended, []
        return ended + outputs

    def _execute(self, scheduled: list[ScheduledRequest]) -> tuple[Tensor, Tensor | None]:
        """Run the model: logits at each sampling request's last token and its draft tokens; aux hidden
        states at every token when the drafter reads them."""
        chunks = self.input_batch.step_of(scheduled)
        aux_layer_ids = self.spec.drafter.aux_layer_ids if self.spec is not None else ()
        if aux_layer_ids:
            return self.runner.execute_with_aux(chunks, aux_layer_ids)
        return self.runner.execute(chunks), None

    def _update(
        self, scheduled: list[ScheduledRequest], logits: Tensor, aux: Tensor | None
    ) -> list[EngineCoreOutput]:
        """Verify drafts, append tokens, stop requests, count drafts and hand new context to the drafter:
        one pass over the step's requests."""
        sampling = [s for s in scheduled if s.samples]
        batch = self._sampling_batch(sampling, logits)
        # Grammars (logprobs see them, as vLLM's), then penalties, bias and masks (logprobs stay raw) at every
        # verified row, drafts included.
        apply_grammars(logits, sampling)
        sampled = verify(processed_logits(logits, sampling), [s.spec_token_ids for s in sampling], batch)
        appended = iter(zip(sampled, sampled_logprobs(logits, sampling, sampled), strict=True))
        spec = self.spec
        new_rows: list[int] = []  # the last token of each request that goes on, for the input batch
        new_positions: list[int] = []
        new_tokens: list[int] = []
        outputs = []
        context: list[ContextUpdate] = []
        broken: list[Request] = []  # requests whose grammar refused a token other options forced
        row = 0  # first row of this request's tokens in aux
        for s in scheduled:
            request, start = s.request, s.start
            if s.admitted and spec is not None:
                # Its whole context goes to this drafter: computed from here on, or cached with its context.
                request.drafter_generation = spec.generation
            num_valid = s.num_new_tokens  # tokens whose KV is now valid
            if s.samples:
                tokens, logprobs = next(appended)
                num_accepted = len(tokens) - 1
                num_valid += num_accepted
                num_kept = self._append(request, tokens)
                if request.grammar is not None and not request.grammar.advance(tokens[:num_kept]):
                    broken.append(request)
                if request.row is not None:
                    new_rows.append(request.row)
                    new_positions.append(len(request.all_token_ids) - 1)
                    new_tokens.append(tokens[-1])
                if logprobs is not None and request.unsent_logprobs is not None:
                    request.unsent_logprobs.extend(logprobs[:num_kept])
                if s.spec_token_ids:
                    request.spec_token_ids = ()
                    if spec is not None:
                        # An accepted run cut by EOS or a stop token counts up to and including it.
                        spec.observe(request, len(s.spec_token_ids), min(num_kept, num_accepted))
                outputs.append(request.take_output())
            if self.scheduler.commit(s, num_valid):  # the KV manager freed rejected drafts' blocks
                self.input_batch.trimmed(request)
            if aux is not None and spec is not None:
                # A request that goes on (an ended one has lost its row) hands its new context over.
                if request.row is not None and spec.can_draft(request):
                    context.append(ContextUpdate(request.block_ids, start, aux[row : row + num_valid]))
                    self.kv_cache.mark_drafted(request, start, start + num_valid, spec.generation)
                row += s.num_new_tokens + len(s.spec_token_ids)
        if context and spec is not None:
            spec.drafter.extend_context(context)
        self.input_batch.append(new_rows, new_positions, new_tokens)
        for request in broken:
            if not request.status.is_finished:
                outputs.append(self._refuse(request, _NO_ALLOWED_TOKEN))
        return outputs

    def _sampling_batch(self, sampling: list[ScheduledRequest], logits: Tensor) -> SamplingBatch:
        """The sampling parameters of the requests that sample this step (one list when all are greedy)."""
        temperatures = [s.request.temperature for s in sampling]
        if not any(temperatures):
            return SamplingBatch.greedy(len(sampling), logits.shape[1])
        requests = [s.request for s in sampling]
        return SamplingBatch.build(
            temperatures,
            [r.sampling_params.top_k for r in requests],
            [r.sampling_params.top_p for r in requests],
            [r.generator or self.generator for r in requests],
            vocab_size=logits.shape[1],
            min_ps=[r.sampling_params.min_p for r in requests],
        )

    def _append(self, request: Request, tokens: list[int]) -> int:
        """Append tokens until one stops the request (a stop token, then max_tokens or the model length,
        checked in that order after each token); return how many were appended."""
        room = request.token_limit - len(request.all_token_ids)
        stop_ids = request.stop_ids
        if len(tokens) < room and stop_ids.isdisjoint(tokens):
            request.all_token_ids += tokens
            return len(tokens)
        for i, token in enumerate(tokens):
            stopped = token in stop_ids
            if stopped or i + 1 >= room:
                request.all_token_ids += tokens[: i + 1]
                if stopped:
                    request.finish = FinishReason("stop", stop_token_id=token)
                self._finish(
                    request, RequestStatus.FINISHED_STOPPED if stopped else RequestStatus.FINISHED_LENGTH
                )
                return i + 1
        raise AssertionError("unreachable: a token stops the request or it has room for all of them")

    def _propose(self, scheduled: list[ScheduledRequest]) -> None:
        """Draft for every request that just sampled and goes on: one drafter call for the batch."""
        if self.spec is None:
            return
        requests, queries = [], []
        for s in scheduled:
            request = s.request
            if s.samples and not request.status.is_finished and self.spec.can_draft(request):
                query = self.spec.query(request, self.facts.max_model_len)
                if query.max_drafts > 0:
                    requests.append(request)
                    queries.append(query)
        if queries:
            for request, drafts in zip(requests, self.spec.drafter.propose(queries), strict=True):
                request.spec_token_ids = tuple(drafts)

    def _finish(self, request: Request, status: RequestStatus) -> None:
        self.grammars.remove(request)
        self.scheduler.finish(request, status)
        self.input_batch.remove(request)
        if request.finish is None:
            request.finish = FinishReason(_FINISH_KIND[status])
        del self.requests[request.request_id]

    def load_snapshot(self) -> LoadSnapshot:
        return LoadSnapshot(
            kv_used_blocks=self.kv_cache.num_used_blocks,
            kv_total_blocks=self.kv_cache.num_blocks,
            num_running_reqs=len(self.scheduler.running),
            num_waiting_reqs=len(self.scheduler.waiting),
            spec_decode=self.spec.counters if self.spec is not None else None,
            prefix_cache=self.kv_cache.counters,
        )
