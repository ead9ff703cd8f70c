"""The prefix-cache metrics bridge: per-engine baselines over cumulative lookups -> Prometheus counters.

Each engine with prefix caching on sends its cumulative :class:`PrefixCacheCounters` (tokens looked up
and tokens found cached, counted once per request at its first admission) in every load snapshot, None
with caching off. They are diffed per engine index by the same rules as the spec-decode counters
(:mod:`openinfer.frontend.metrics.engine_baselines`, docs/design.md frontend diffing): an index never seen
gives the baseline and publishes nothing; a new incarnation counts from zero; a counter that went down is
``openinfer:protocol_errors_total{kind="counter_decrease"}`` and more hits than queries in a delta is
``kind="counter_delta"``, both publishing nothing; None forgets the baseline. Snapshots whose own
counters break ``0 <= hits <= queries`` never get here: the codec drops them (kind "counters").

Exported series, one per (model_name, engine), never an "all engines" one, from the first snapshot that
carries counters (at 0, so that rate() sees the first increase); vLLM's names, in tokens:

- ``vllm:prefix_cache_queries_total``: prompt tokens looked up in the prefix cache
- ``vllm:prefix_cache_hits_total``: of those, tokens whose KV was found cached

Derived rates, for dashboards (sum over engines first; drop the ``sum`` for one engine):

- prefix-cache hit rate (share of looked-up prompt tokens that were cached, 0..1)::

    sum(rate(vllm:prefix_cache_hits_total[5m]))
      / sum(rate(vllm:prefix_cache_queries_total[5m]))

- prompt tokens per second served from the cache: ``sum(rate(vllm:prefix_cache_hits_total[5m]))``
"""

from __future__ import annotations

from openinfer.frontend.metrics.engine_baselines import EngineBaselines
from openinfer.frontend.metrics.totals import CounterFamily, MetricTotals
from openinfer.protocol import PrefixCacheCounters

_MODEL_ENGINE = ("model_name", "engine")


class PrefixCacheMetrics:
    """The prefix-cache Prometheus counters and the per-engine baselines they are published from."""

    def __init__(self, totals: MetricTotals, protocol_errors: CounterFamily) -> None:
        # saved and restored with the totals (--state-dir), asked and forgotten by FrontendMetrics
        self.baselines = EngineBaselines[PrefixCacheCounters]("prefix-cache", protocol_errors)
        self.queries = totals.counter(
            "vllm:prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache (once per request, at its first admission).",
            _MODEL_ENGINE,
        )
        self.hits = totals.counter(
            "vllm:prefix_cache_hits", "Prompt tokens whose KV the prefix cache held.", _MODEL_ENGINE
        )

    def observe(
        self, engine_index: int, incarnation: int, model_name: str, counters: PrefixCacheCounters | None
    ) -> None:
        """Take one snapshot's counters and publish the delta since the baseline, if any."""
        seen = self.baselines.observe(engine_index, incarnation, counters)
        if seen.began:
            self._publish(model_name, engine_index, PrefixCacheCounters())  # the series exist at 0 from now
        if seen.delta is not None:
            self._publish(model_name, engine_index, seen.delta)

    def _publish(self, model_name: str, engine_index: int, delta: PrefixCacheCounters) -> None:
        labels = (model_name, str(engine_index))
        self.queries.inc(labels, delta.queries)
        self.hits.inc(labels, delta.hits)
