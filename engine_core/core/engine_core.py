"""The engine core: one step is schedule -> execute -> update."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from openinfer.engine_core.config import DrafterSpec, EngineConfig
from openinfer.engine_core.core.kv_cache_manager import KVCacheManager
from openinfer.engine_core.core.kv_event_log import KVEventLog
from openinfer.engine_core.core.prefix_states import PrefixStates
from openinfer.engine_core.core.request_checks import refusal
from openinfer.engine_core.core.runtime_facts import RuntimeFacts
from openinfer.engine_core.core.scheduler import Scheduler
from openinfer.engine_core.request import Request, RequestStatus
from openinfer.engine_core.sample.sampler import Sampler
from openinfer.engine_core.sample.structured_output import GrammarCompilers, GrammarQueue
from openinfer.engine_core.scheduler_output import RequestUpdate, SchedulerOutput
from openinfer.engine_core.spec_decode.adaptive import StepCosts, profile_step_costs
from openinfer.engine_core.spec_decode.spec_decoder import SpecDecoder
from openinfer.engine_core.spec_decode.spec_log import SpecLog
from openinfer.engine_core.worker.executor import ModelExecutor
from openinfer.engine_core.worker.worker import Worker
from openinfer.protocol import EngineCoreOutput, EngineCoreRequest, FinishReason, LoadSnapshot

logger = logging.getLogger(__name__)

_NO_ALLOWED_TOKEN = "the other sampling options leave no token the structured output allows"


@dataclass(frozen=True)
class _BusyStep:
    """A step after which the engine still had work: what its timing is told with."""

    began: float  # perf_counter() at its start
    decided: SchedulerOutput
    tokens: int  # output tokens it gave
    spec: SpecDecoder | None  # the drafter it ran with


class EngineCore:
    """Requests in, token outputs out; owns the scheduler and the KV cache, and steps the runner it is given
    (the engine process chooses the real one or ``--fake-model``'s)."""

    def __init__(self, config: EngineConfig, runner: ModelExecutor, incarnation: int = 0) -> None:
        self.config = config
        self.incarnation = incarnation
        self.runner = runner
        self.facts = RuntimeFacts.found(config, runner)
        facts = self.facts
        states = runner.state_geometry  # a hybrid model's state slots: a group per running request
        self.kv_cache = KVCacheManager(
            facts.num_kv_blocks,
            facts.block_size,
            config.enable_prefix_caching,
            num_state_groups=states.num_groups if states is not None else 0,
            prefix_states=(
                PrefixStates(states.num_prefix_slots, states.prefix_interval)
                if states is not None and states.num_prefix_slots
                else None
            ),
        )
        if config.publishes_kv_events:  # the first event of a process: whatever an earlier one held is gone
            self.kv_cache.event_log = KVEventLog(facts.block_size)
            self.kv_cache.event_log.cleared()
        self.scheduler = Scheduler(self.kv_cache, config.max_num_seqs, config.max_num_batched_tokens)
        # Requests without a seed of their own draw from this one (no global RNG state).
        self.generator = torch.Generator(device=runner.device).manual_seed(config.seed)
        self.worker = Worker(
            runner,
            Sampler(self.generator),
            config.max_num_seqs,
            facts.max_model_len,
            states,
        )
        self.requests: dict[str, Request] = {}
        # Requests whose grammar is compiling (the compiler is built for the first one)
        tokenizer_json = config.model_path / "tokenizer.json"
        self.grammars = GrammarQueue(GrammarCompilers(tokenizer_json, facts.vocab_size, facts.eos_token_ids))
        self._ended: list[EngineCoreOutput] = []  # outputs of requests ended outside a step
        self.spec_log = (
            SpecLog(config.spec_log, config.engine_index, incarnation) if config.spec_log else None
        )
        self.spec: SpecDecoder | None = None
        # What steps cost, for adaptive verification: measured now (before any request) when the start
        # drafter asks for it, then refreshed by every step.
        self.step_costs: StepCosts | None = None
        self._last_step: _BusyStep | None = None  # timed when the next step starts (_time_last_step)
        spec = config.speculative
        if spec is not None and spec.adaptive_verification:
            self.step_costs = profile_step_costs(
                runner, spec.num_spec_tokens, config.max_num_seqs, config.max_num_batched_tokens
            )
            logger.info("step costs measured for adaptive verification: %s", self.step_costs.describe())
        if spec is not None:
            self.load_drafter(spec)

    # ---- speculative decoding -----------------------------------------------------------------------

    def load_drafter(self, spec: DrafterSpec) -> str:
        """Build and install a drafter now (at start, and in tests); see :meth:`install_drafter`."""
        return self.install_drafter(self.build_drafter(spec))

    def build_drafter(self, spec: DrafterSpec) -> SpecDecoder:
        """Load a drafter's weights without touching the running state (safe in a background thread)."""
        if spec.adaptive_verification and self.step_costs is None:
            raise ValueError(
                "adaptive verification needs the step costs an engine measures at start: start the engine with "
                "--enable-adaptive-verification"
            )
        states = self.runner.state_geometry
        if states is not None and spec.num_spec_tokens + 1 > states.group_size:
            raise ValueError(
                f"this hybrid model keeps {states.group_size} state slot(s) per request (1 + the start "
                f"drafter's speculative tokens), too few to verify {spec.num_spec_tokens} drafts: restart the "
                f"engine with a drafter of at least {spec.num_spec_tokens} speculative tokens"
            )
        return SpecDecoder(spec, self.runner, self.spec_log)

    def install_drafter(self, loaded: SpecDecoder) -> str:
        """Make ``loaded`` the drafter.

        Counters are cumulative per incarnation and K (docs/design.md): a replacement with the same K keeps
        counting in the same counters; a new K, or a load after none, starts from zero.
        """
        loaded.continue_counting(self.spec)
        loaded.step_costs = self.step_costs
        self.scheduler.drop_drafts()
        self.spec = loaded
        self.kv_cache.hit_filter = loaded.hit_filter
        self.runner.warm_up(loaded.aux_layer_ids)  # a compiled step's graphs with the drafter's aux layers
        logger.info("drafter loaded: %s", loaded.describe())
        return loaded.describe()

    def unload_drafter(self) -> None:
        """Turn speculation off; counters are gone (a later drafter starts from zero)."""
        self.scheduler.drop_drafts()
        self.spec = None
        self.kv_cache.hit_filter = None
        logger.info("drafter unloaded")

    def fail_running(self, message: str) -> list[EngineCoreOutput]:
        """End every running request with an error (a step failed); waiting requests go on, and no block the
        step may have written stays cached."""
        self.kv_cache.reset()
        outputs = []
        for request in list(self.scheduler.running):
            self._end(request, RequestStatus.FINISHED_ERROR, FinishReason("error", message=message))
            outputs.append(request.take_output())
        return outputs

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
        self._end(
            request, RequestStatus.FINISHED_ERROR, FinishReason("error", message=message, bad_request=True)
        )
        return request.take_output()

    def abort(self, request_ids: list[str], error: str | None = None) -> None:
        """End these requests now (unknown or already ended ids are ignored): aborted, or with ``error``."""
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None:
                continue
            if error is None:
                self._end(request, RequestStatus.FINISHED_ABORTED)
            else:
                self._end(request, RequestStatus.FINISHED_ERROR, FinishReason("error", message=error))
            self._ended.append(request.take_output())

    # ---- the step -----------------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work or bool(self.grammars)

    def step(self) -> list[EngineCoreOutput]:
        """Run one model step over the scheduled requests and return what changed for the frontend (the
        outputs of requests ended since the last step first; a step that raises keeps them for the next)."""
        began = time.perf_counter()
        self._time_last_step(began)
        self._admit_compiled()
        decided = self.scheduler.schedule()
        spec = self.spec
        # The worker runs, samples and drafts (DFlash) on the device, then reads the step back once; from
        # here on the step is booked on the host, without touching the device.
        output = self.worker.execute(decided, spec)
        outputs = []
        if decided.scheduled:
            updates = self.scheduler.update_from_output(decided, output)
            if spec is not None:
                spec.after_step(decided, updates)
            outputs = self._outputs(updates)
            if spec is not None:
                proposals = spec.propose(
                    output.draft_ids,
                    output.draft_confidence,
                    len(self.scheduler.running),
                    finite=output.draft_finite,
                )
                for request, drafts, num_proposed in proposals:
                    self.scheduler.set_drafts(request, drafts, num_proposed)
            if self.scheduler.has_work:  # the next step follows at once: timed at its start
                tokens = sum(len(out.new_token_ids) for out in outputs)
                self._last_step = _BusyStep(began, decided, tokens, spec)
        if self.spec_log is not None:
            self.spec_log.flush()
        ended, self._ended = self._ended, []
        return ended + outputs

    def _time_last_step(self, now: float) -> None:
        """Tell the step costs and the drafting policy what the last step took: from its start to this one's,
        its outputs' encoding and sending and whatever else the serving loop (and the frontend sharing these
        cores) costs a step included, since that is what a step costs the server. A step after which the
        engine had no work is not timed (the time until this one holds waiting)."""
        last, self._last_step = self._last_step, None
        if last is None:
            return
        seconds = now - last.began
        costs = self.step_costs
        if costs is not None:
            attention = sum(
                costs.attention_seconds(s.num_new_tokens + len(s.spec_token_ids), s.start)
                for s in last.decided.scheduled
            )
            costs.observe(last.decided.num_tokens, seconds, attention)
        if last.spec is not None and last.spec is self.spec:
            last.spec.observe_step(last.decided, last.tokens, seconds)

    def _outputs(self, updates: list[RequestUpdate]) -> list[EngineCoreOutput]:
        """Count the verified drafts and take each sampling request's output; end the requests whose grammar
        refused a token the other sampling options forced."""
        spec = self.spec
        outputs = []
        refused: list[Request] = []
        for update in updates:
            s = update.scheduled
            if not s.samples:
                continue
            request = s.request
            if s.spec_token_ids and spec is not None:
                spec.observe(request, len(s.spec_token_ids), update.num_accepted, s.num_proposed)
            elif s.num_proposed and spec is not None:  # the token budget left none of its drafts
                spec.observe_unverified(request, s.num_proposed)
            outputs.append(request.take_output())
            if request.status.is_finished:
                del self.requests[request.request_id]
            elif update.grammar_refused:
                refused.append(request)
        outputs.extend(self._refuse(request, _NO_ALLOWED_TOKEN) for request in refused)
        return outputs

    def _end(self, request: Request, status: RequestStatus, reason: FinishReason | None = None) -> None:
        """End a request outside the step's own stops (an abort, a refusal, a failed step)."""
        self.grammars.remove(request)
        self.scheduler.finish(request, status, reason)
        del self.requests[request.request_id]

    def load_snapshot(self) -> LoadSnapshot:
        return LoadSnapshot(
            kv_used_blocks=self.kv_cache.num_busy_blocks,
            kv_total_blocks=self.kv_cache.num_blocks,
            num_running_reqs=len(self.scheduler.running),
            num_waiting_reqs=len(self.scheduler.waiting),
            spec_decode=self.spec.counters if self.spec is not None else None,
            prefix_cache=self.kv_cache.counters,
        )
