"""The frontend's Prometheus metrics: vLLM-compatible serving metrics plus openinfer's engine health.

Names follow docs/design.md exactly. Counters are declared without ``_total``, which the exposition appends
(``vllm:prompt_tokens`` is exported as ``vllm:prompt_tokens_total``). Counters and histograms live in a
:class:`MetricTotals` (plain numbers), so that ``--state-dir`` can save them with the per-engine baselines
and a restarted frontend continues every series exactly; gauges are prometheus_client's (nothing to keep).

The speculative-decoding counters and their derived rates are in :mod:`openinfer.frontend.metrics.spec_decode.bridge`,
the prefix-cache counters and the hit rate in :mod:`openinfer.frontend.metrics.prefix_cache_bridge`.

Derived rates, for dashboards:

- request throughput: ``sum(rate(vllm:request_success_total[1m]))``
- output tokens per second: ``sum(rate(vllm:generation_tokens_total[1m]))``
- p99 time to first token:
  ``histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[5m])))``
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from openinfer.frontend.metrics.prefix_cache_bridge import PrefixCacheMetrics
from openinfer.frontend.metrics.spec_decode.bridge import SpecDecodeMetrics
from openinfer.frontend.metrics.spec_decode.counted_seqs import CountedSeqsLog
from openinfer.frontend.metrics.spec_decode.log_line import SpecDecodeLogger
from openinfer.frontend.metrics.state_dir import STATE_VERSION, FrontendState, StateDir
from openinfer.frontend.metrics.totals import MetricTotals
from openinfer.protocol import LoadSnapshot

logger = logging.getLogger(__name__)

# vLLM's buckets, so that its dashboards read the same.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)  # fmt: skip
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
_N_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0)

_MODEL_ENGINE = ("model_name", "engine")

# Forgotten engine indices whose counting state (baselines, latest incarnation) is kept after their series
# are dropped, oldest dropped first: a real engine forgotten while its first step outlasted the engine timeout
# continues exactly when it comes back. Strangers can have any number of indices forgotten (a hello each).
MAX_FORGOTTEN = 1024


class FrontendMetrics:
    """Every metric the frontend exports, in a registry of its own (never the global one).

    Engine-scoped series are labelled ``engine=str(engine_index)``: exactly one series per (model_name,
    engine), never an "all engines" series, since PromQL sums over series.

    With a :class:`StateDir`, the state saved there is restored at once, and saved again before every
    :meth:`render` (a scrape never shows totals that a restarted frontend would not continue from) and
    whenever :meth:`save` is called (periodically, by the frontend's main loop).
    """

    def __init__(self, state_dir: StateDir | None = None) -> None:
        self.registry = CollectorRegistry()
        self.totals = MetricTotals()
        self._state_dir = state_dir
        self._incarnations: dict[int, int] = {}  # the latest incarnation of each engine index
        self._forgotten: dict[int, None] = {}  # indices whose series were dropped, oldest first
        r, t = self.registry, self.totals

        # Load, from each engine's latest LoadSnapshot.
        self.num_requests_running = Gauge(
            "vllm:num_requests_running", "Requests the engine is running.", _MODEL_ENGINE, registry=r
        )
        self.num_requests_waiting = Gauge(
            "vllm:num_requests_waiting", "Requests waiting in the engine's queue.", _MODEL_ENGINE, registry=r
        )
        self.kv_cache_usage_perc = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache blocks in use (0..1).", _MODEL_ENGINE, registry=r
        )

        # Requests, as this frontend saw them.
        self.prompt_tokens = t.counter(
            "vllm:prompt_tokens", "Prompt tokens of requests that started.", _MODEL_ENGINE
        )
        self.generation_tokens = t.counter("vllm:generation_tokens", "Output tokens received.", _MODEL_ENGINE)
        self.request_success = t.counter(
            "vllm:request_success",
            "Requests that finished, by finish reason (stop, length, abort).",
            (*_MODEL_ENGINE, "finished_reason"),
        )
        self.time_to_first_token = t.histogram(
            "vllm:time_to_first_token_seconds",
            "Seconds from a request's arrival to its first output token.",
            ("model_name",),
            _TTFT_BUCKETS,
        )
        self.inter_token_latency = t.histogram(
            "vllm:inter_token_latency_seconds",
            "Seconds between successive outputs of one request (one observation per engine output).",
            ("model_name",),
            _ITL_BUCKETS,
        )
        self.e2e_request_latency = t.histogram(
            "vllm:e2e_request_latency_seconds",
            "Seconds from a request's arrival to its last output token.",
            ("model_name",),
            _E2E_BUCKETS,
        )
        self.request_params_n = t.histogram(
            "vllm:request_params_n",
            "The n request parameter (choices) of each request, observed once when it ends.",
            ("model_name",),
            _N_BUCKETS,
        )

        # Engine health and the wire.
        self.engine_up = Gauge(
            "openinfer:engine_up", "1 while the engine is alive, else 0.", ("engine",), registry=r
        )
        self.engine_restarts = t.counter(
            "openinfer:engine_restarts",
            "Times an engine index came back with a new incarnation.",
            ("engine",),
        )
        self.protocol_errors = t.counter(
            "openinfer:protocol_errors", "Bad frames dropped, by kind.", ("kind",)
        )
        self.hellos_refused = t.counter(
            "openinfer:engine_hellos_refused",
            "Engine hellos refused, by the index claimed and why (engine_alive: a live engine holds that "
            "index; version; tokenizer).",
            ("engine", "reason"),
        )

        # Speculative decoding: exact deltas of each engine's cumulative counters, and the periodic log line.
        self.spec_decode = SpecDecodeMetrics(t, self.protocol_errors)
        self.spec_decode_log = SpecDecodeLogger()
        # Prefix caching: exact deltas of each engine's cumulative lookups, by the same rules.
        self.prefix_cache = PrefixCacheMetrics(t, self.protocol_errors)
        # Which spec-log lines the totals hold: the seqs counted of each incarnation.
        self.counted_seqs = CountedSeqsLog()
        r.register(t)

        state = state_dir.load() if state_dir is not None else None
        if state is not None:
            t.restore(state.totals)
            self.spec_decode.restore_baselines(state.spec_baselines)
            self.prefix_cache.baselines.restore(state.prefix_cache_baselines)
            self._incarnations = dict(state.incarnations)
            self.counted_seqs.restore(state.counted_seqs)
            for index in state.forgotten:
                self._keep_forgotten(index)
            logger.info(
                "continuing the counters saved in %s (%d engine baselines)",
                state_dir.file if state_dir else "",
                len(state.spec_baselines),
            )

    # ---- state ----

    def state(self) -> FrontendState:
        """Totals and baselines now, taken together (nothing runs in between on the event loop)."""
        return FrontendState(
            STATE_VERSION,
            self.totals.state(),
            self.spec_decode.baselines.saved(),
            dict(self._incarnations),
            self.prefix_cache.baselines.saved(),
            list(self._forgotten),
            self.counted_seqs.saved(),
        )

    def save(self) -> None:
        """Save the state to the ``--state-dir``, if there is one (a no-op when nothing changed)."""
        if self._state_dir is not None:
            self._state_dir.save(self.state())

    def save_logged(self) -> None:
        """:meth:`save`, with a failure logged instead of raised (a later save tries again)."""
        try:
            self.save()
        except OSError as e:
            logger.error("could not save the frontend state: %s", e)

    # ---- engines ----

    def engine_joined(self, engine_index: int, incarnation: int) -> None:
        """A hello from a new incarnation: counted as a restart when the index had another one before
        (also one seen by the frontend whose state this one continues, or one forgotten since)."""
        previous = self._incarnations.get(engine_index)
        self._incarnations[engine_index] = incarnation
        self._forgotten.pop(engine_index, None)  # its series come back with its next counters
        if previous is not None and previous != incarnation:
            self.engine_restarts.inc((str(engine_index),))
        else:
            self.engine_restarts.inc((str(engine_index),), 0)  # the series exists from the first hello

    def observe_message(
        self, engine_index: int, incarnation: int, seq: int, model_name: str, load: LoadSnapshot
    ) -> None:
        """Publish the snapshot of message ``seq`` of a current engine incarnation (:meth:`observe_load`),
        and record that the totals now hold its spec-log lines through that seq."""
        first_sight = not self.spec_decode.baselines.knows(engine_index)
        self.counted_seqs.observe(engine_index, incarnation, seq, first_sight)
        self.observe_load(engine_index, incarnation, model_name, load)

    def observe_load(self, engine_index: int, incarnation: int, model_name: str, load: LoadSnapshot) -> None:
        """Publish one snapshot of a current engine incarnation: every message carries one, in seq order.

        Its spec-decode and prefix-cache counters go through their bridges (per-engine baselines, docs/design.md
        frontend diffing). The state is saved at once when this snapshot gives an index its first baseline
        here (at its join), not at the next ``--state-interval``: a frontend killed before then would
        restart without that baseline, take the engine's next snapshot for one and lose what came between.
        Later joins of the index (a restart, a paused or forgotten engine back) have a saved baseline to go
        on from (a restarted frontend diffs a new incarnation from zero), so they save nothing.
        """
        first_sight = not (
            self.spec_decode.baselines.knows(engine_index) and self.prefix_cache.baselines.knows(engine_index)
        )
        delta = self.spec_decode.observe(engine_index, incarnation, model_name, load.spec_decode)
        if delta is not None:
            self.spec_decode_log.add(delta)
        self.prefix_cache.observe(engine_index, incarnation, model_name, load.prefix_cache)
        engine = str(engine_index)
        self.num_requests_running.labels(model_name, engine).set(load.num_running_reqs)
        self.num_requests_waiting.labels(model_name, engine).set(load.num_waiting_reqs)
        usage = load.kv_used_blocks / load.kv_total_blocks if load.kv_total_blocks else 0.0
        self.kv_cache_usage_perc.labels(model_name, engine).set(usage)
        if first_sight:
            self.save_logged()

    def forget_load(self, engine_index: int, model_name: str) -> None:
        """Drop a dead engine's load series, so that sums over engines do not count stale load."""
        engine = str(engine_index)
        for gauge in (self.num_requests_running, self.num_requests_waiting, self.kv_cache_usage_perc):
            try:
                gauge.remove(model_name, engine)
            except KeyError:
                pass  # it never sent a snapshot

    def forget_engine(self, engine_index: int) -> bool:
        """Drop every series of an engine index whose counters never moved from zero (its record joined and
        was never heard from again: forged hellos leave no series behind); False, and nothing dropped, when
        one moved: exported counters never go down. Its baselines and latest incarnation are kept among the
        last :data:`MAX_FORGOTTEN` forgotten indices, so counting goes on exactly if it comes back (a real
        engine whose first step outlasted the timeout) or restarts. Its load gauges go when it goes down
        (:meth:`forget_load`)."""
        engine = str(engine_index)
        if not self.totals.drop_zero_series("engine", engine):
            return False
        try:
            self.engine_up.remove(engine)
        except KeyError:
            pass  # never set
        self._keep_forgotten(engine_index)
        return True

    def _keep_forgotten(self, engine_index: int) -> None:
        """Mark an index's series as dropped, its counting state kept; past :data:`MAX_FORGOTTEN` forgotten
        indices, the oldest one's state goes too (its next hello is a first sight)."""
        self.spec_decode.baselines.drop_series(engine_index)
        self.prefix_cache.baselines.drop_series(engine_index)
        self._forgotten.pop(engine_index, None)
        self._forgotten[engine_index] = None
        if len(self._forgotten) > MAX_FORGOTTEN:
            oldest = next(iter(self._forgotten))
            del self._forgotten[oldest]
            self.spec_decode.baselines.forget(oldest)
            self.prefix_cache.baselines.forget(oldest)
            self._incarnations.pop(oldest, None)

    def set_engine_up(self, engine_index: int, up: bool) -> None:
        self.engine_up.labels(str(engine_index)).set(1 if up else 0)

    def count_protocol_error(self, kind: str) -> None:
        self.protocol_errors.inc((kind,))

    def count_hello_refused(self, engine_index: int | None, reason: str) -> None:
        """A hello refused (None: another version's hello that does not say its index)."""
        self.hellos_refused.inc(("unknown" if engine_index is None else str(engine_index), reason))

    # ---- requests ----

    def observe_first_token(
        self, model_name: str, engine_index: int, num_prompt_tokens: int, time_to_first_token: float
    ) -> None:
        """A request's prompt was processed and its first output arrived."""
        self.prompt_tokens.inc((model_name, str(engine_index)), num_prompt_tokens)
        self.time_to_first_token.observe((model_name,), time_to_first_token)

    def observe_output(
        self, model_name: str, engine_index: int, num_tokens: int, inter_token_latency: float | None
    ) -> None:
        """An engine output brought ``num_tokens`` tokens; no latency for a request's first output."""
        self.generation_tokens.inc((model_name, str(engine_index)), num_tokens)
        if inter_token_latency is not None:
            self.inter_token_latency.observe((model_name,), inter_token_latency)

    def observe_finish(
        self, model_name: str, engine_index: int, finished_reason: str, e2e_latency: float | None
    ) -> None:
        """A request ended ("stop", "length" or "abort"); the latency is None when it was cut short."""
        self.request_success.inc((model_name, str(engine_index), finished_reason))
        if e2e_latency is not None:
            self.e2e_request_latency.observe((model_name,), e2e_latency)

    def observe_request_params_n(self, model_name: str, n: int) -> None:
        """A request of ``n`` choices ended (each choice is a request of its own to the other metrics)."""
        self.request_params_n.observe((model_name,), n)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric, after saving the state it shows."""
        self.save()
        return generate_latest(self.registry)
