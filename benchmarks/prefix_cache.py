"""Prefix-cache hits of one run: the ``/metrics`` deltas of vLLM's counters, and what the requests' usage says.

``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total`` ({model_name, engine}) count prompt
tokens looked up in the cache and tokens found there; the run's hit rate is the hits' delta over the
queries' delta, summed over every series (PromQL: ``sum(increase(hits[w])) / sum(increase(queries[w]))``).
Per request, ``usage.prompt_tokens_details.cached_tokens`` (OpenAI's field) says how many prompt tokens came
from the cache. Whichever of the two a server does not give is reported as "n/a".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

QUERIES = "vllm:prefix_cache_queries_total"
HITS = "vllm:prefix_cache_hits_total"
NOT_AVAILABLE = "n/a"


@dataclass(frozen=True)
class PrefixCacheCounts:
    """Prompt tokens looked up in the prefix cache (queries) and found there (hits)."""

    queries: int = 0
    hits: int = 0

    def minus(self, before: PrefixCacheCounts) -> PrefixCacheCounts:
        """The increase since ``before``, as Prometheus' ``increase`` counts one: a counter that went down was
        reset (its server restarted), so all it holds now is new."""
        if self.queries < before.queries or self.hits < before.hits:
            return self
        return PrefixCacheCounts(self.queries - before.queries, self.hits - before.hits)

    def plus(self, other: PrefixCacheCounts) -> PrefixCacheCounts:
        return PrefixCacheCounts(self.queries + other.queries, self.hits + other.hits)

    @property
    def hit_rate(self) -> float:
        """Hits over queries; NaN without queries."""
        return self.hits / self.queries if self.queries else math.nan


def prefix_cache_counts(text: str) -> dict[str, PrefixCacheCounts]:
    """The two counters of a ``/metrics`` text per ``engine`` label, summed over model names; ``{}`` when it
    has neither. Raises ``ValueError`` when the text does not parse."""
    engines: dict[str, PrefixCacheCounts] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:  # sample names keep "_total"; the "_created" samples are skipped
            if sample.name not in (QUERIES, HITS):
                continue
            engine = sample.labels.get("engine", "")
            value = round(sample.value)
            step = PrefixCacheCounts(value, 0) if sample.name == QUERIES else PrefixCacheCounts(0, value)
            engines[engine] = engines.get(engine, PrefixCacheCounts()).plus(step)
    return engines


@dataclass(frozen=True)
class PrefixCacheReport:
    """The run's prefix-cache figures: the counters' deltas summed over engines, and the cached tokens the
    successful requests' usage reported."""

    before: dict[str, PrefixCacheCounts] | None  # per engine label; None: /metrics was not read
    after: dict[str, PrefixCacheCounts] | None
    cached_tokens: int | None  # summed over the requests that reported it; None: none did

    @property
    def engines(self) -> dict[str, PrefixCacheCounts]:
        """Each engine's delta (an engine first seen after the run started counts from zero)."""
        if self.before is None or self.after is None:
            return {}
        return {e: c.minus(self.before.get(e, PrefixCacheCounts())) for e, c in sorted(self.after.items())}

    @property
    def total(self) -> PrefixCacheCounts | None:
        """The deltas summed over engines; None when /metrics has no prefix-cache counter (or was not read)."""
        if not self.after:
            return None
        total = PrefixCacheCounts()
        for counts in self.engines.values():
            total = total.plus(counts)
        return total

    def hit_rate_cell(self) -> str:
        """The hit rate as a percentage, or "n/a" without counters or without queries."""
        total = self.total
        if total is None or total.queries == 0:
            return NOT_AVAILABLE
        return f"{100 * total.hit_rate:.1f}%"

    def format(self) -> str:
        total = self.total
        if self.after is None:
            rate = f"{NOT_AVAILABLE} (/metrics not read)"
        elif total is None:
            rate = f"{NOT_AVAILABLE} (no vllm:prefix_cache_* counters on /metrics)"
        else:
            rate = f"{self.hit_rate_cell()} ({total.hits} of {total.queries} prompt tokens)"
        cached = NOT_AVAILABLE if self.cached_tokens is None else str(self.cached_tokens)
        return "\n".join([
            f"{'Prefix cache hit rate (/metrics):':<40} {rate}",
            f"{'Cached prompt tokens (usage):':<40} {cached}",
        ])  # fmt: skip

    def to_json(self) -> dict[str, object]:
        total = self.total
        return {
            "queries": None if total is None else total.queries,
            "hits": None if total is None else total.hits,
            "hit_rate": None if total is None or total.queries == 0 else total.hit_rate,
            "cached_tokens": self.cached_tokens,
            "engines": {e: {"queries": c.queries, "hits": c.hits} for e, c in self.engines.items()},
        }
