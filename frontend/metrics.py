"""The frontend's Prometheus metrics: vLLM-compatible serving metrics plus openinfer's engine health.

Names follow DESIGN.md exactly. prometheus_client appends ``_total`` to counter names itself, so counters are
declared without it (``vllm:prompt_tokens`` is exported as ``vllm:prompt_tokens_total``).

The speculative-decoding counters and their derived rates are in :mod:`openinfer.frontend.spec_metrics`.

Derived rates, for dashboards:

- request throughput: ``sum(rate(vllm:request_success_total[1m]))``
- output tokens per second: ``sum(rate(vllm:generation_tokens_total[1m]))``
- p99 time to first token:
  ``histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[5m])))``
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from openinfer.frontend.spec_decode_log import SpecDecodeLogger
from openinfer.frontend.spec_metrics import SpecDecodeMetrics
from openinfer.protocol import LoadSnapshot

# vLLM's buckets, so that its dashboards read the same.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)  # fmt: skip
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip

_MODEL_ENGINE = ("model_name", "engine")


class FrontendMetrics:
    """Every metric the frontend exports, in a registry of its own (never the global one).

    Engine-scoped series are labelled ``engine=str(engine_index)``: exactly one series per (model_name,
    engine), never an "all engines" series, since PromQL sums over series.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry

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
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prompt tokens of requests that started.", _MODEL_ENGINE, registry=r
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Output tokens received.", _MODEL_ENGINE, registry=r
        )
        self.request_success = Counter(
            "vllm:request_success",
            "Requests that finished, by finish reason (stop, length, abort).",
            (*_MODEL_ENGINE, "finished_reason"),
            registry=r,
        )
        self.time_to_first_token = Histogram(
            "vllm:time_to_first_token_seconds",
            "Seconds from a request's arrival to its first output token.",
            ("model_name",),
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.inter_token_latency = Histogram(
            "vllm:inter_token_latency_seconds",
            "Seconds between successive outputs of one request (one observation per engine output).",
            ("model_name",),
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.e2e_request_latency = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Seconds from a request's arrival to its last output token.",
            ("model_name",),
            buckets=_E2E_BUCKETS,
            registry=r,
        )

        # Engine health and the wire.
        self.engine_up = Gauge(
            "openinfer:engine_up", "1 while the engine is alive, else 0.", ("engine",), registry=r
        )
        self.engine_restarts = Counter(
            "openinfer:engine_restarts",
            "Times an engine index came back with a new incarnation.",
            ("engine",),
            registry=r,
        )
        self.protocol_errors = Counter(
            "openinfer:protocol_errors", "Bad frames dropped, by kind.", ("kind",), registry=r
        )

        # Speculative decoding: exact deltas of each engine's cumulative counters, and the periodic log line.
        self.spec_decode = SpecDecodeMetrics(r, self.protocol_errors)
        self.spec_decode_log = SpecDecodeLogger()

    def observe_load(self, engine_index: int, incarnation: int, model_name: str, load: LoadSnapshot) -> None:
        """Publish one snapshot of a current engine incarnation: every message carries one, in seq order.

        Its spec-decode counters go through the bridge (per-engine baselines, DESIGN.md frontend diffing).
        """
        delta = self.spec_decode.observe(engine_index, incarnation, model_name, load.spec_decode)
        if delta is not None:
            self.spec_decode_log.add(delta)
        engine = str(engine_index)
        self.num_requests_running.labels(model_name, engine).set(load.num_running_reqs)
        self.num_requests_waiting.labels(model_name, engine).set(load.num_waiting_reqs)
        usage = load.kv_used_blocks / load.kv_total_blocks if load.kv_total_blocks else 0.0
        self.kv_cache_usage_perc.labels(model_name, engine).set(usage)

    def forget_load(self, engine_index: int, model_name: str) -> None:
        """Drop a dead engine's load series, so that sums over engines do not count stale load."""
        engine = str(engine_index)
        for gauge in (self.num_requests_running, self.num_requests_waiting, self.kv_cache_usage_perc):
            try:
                gauge.remove(model_name, engine)
            except KeyError:
                pass  # it never sent a snapshot

    def observe_first_token(
        self, model_name: str, engine_index: int, num_prompt_tokens: int, time_to_first_token: float
    ) -> None:
        """A request's prompt was processed and its first output arrived."""
        self.prompt_tokens.labels(model_name, str(engine_index)).inc(num_prompt_tokens)
        self.time_to_first_token.labels(model_name).observe(time_to_first_token)

    def observe_output(
        self, model_name: str, engine_index: int, num_tokens: int, inter_token_latency: float | None
    ) -> None:
        """An engine output brought ``num_tokens`` tokens; no latency for a request's first output."""
        self.generation_tokens.labels(model_name, str(engine_index)).inc(num_tokens)
        if inter_token_latency is not None:
            self.inter_token_latency.labels(model_name).observe(inter_token_latency)

    def observe_finish(
        self, model_name: str, engine_index: int, finished_reason: str, e2e_latency: float | None
    ) -> None:
        """A request ended ("stop", "length" or "abort"); the latency is None when it was cut short."""
        self.request_success.labels(model_name, str(engine_index), finished_reason).inc()
        if e2e_latency is not None:
            self.e2e_request_latency.labels(model_name).observe(e2e_latency)

    def set_engine_up(self, engine_index: int, up: bool) -> None:
        self.engine_up.labels(str(engine_index)).set(1 if up else 0)

    def count_engine_restart(self, engine_index: int) -> None:
        self.engine_restarts.labels(str(engine_index)).inc()

    def count_protocol_error(self, kind: str) -> None:
        self.protocol_errors.labels(kind).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
