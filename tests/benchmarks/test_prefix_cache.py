"""The bench's prefix-cache figures: hit rate from two /metrics texts as prometheus_client renders them,
"n/a" without the counters, and settled scrapes that wait for these counters too."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from openinfer.benchmarks import acceptance
from openinfer.benchmarks.acceptance import scrape_settled
from openinfer.benchmarks.prefix_cache import PrefixCacheCounts, PrefixCacheReport, prefix_cache_counts


class Exporter:
    """vLLM's two prefix-cache counters {model_name, engine} and an unrelated one, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.queries = Counter(
            "vllm:prefix_cache_queries", "tokens looked up", labels, registry=self.registry
        )
        self.hits = Counter("vllm:prefix_cache_hits", "tokens found", labels, registry=self.registry)
        self.prompts = Counter("vllm:prompt_tokens", "prompt tokens", labels, registry=self.registry)

    def observe(self, engine: str, queries: int, hits: int, model: str = "m") -> None:
        self.queries.labels(model, engine).inc(queries)
        self.hits.labels(model, engine).inc(hits)
        self.prompts.labels(model, engine).inc(queries)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def test_hit_rate_is_the_deltas_summed_over_engines() -> None:
    """Engine 0 moves 100 -> 300 queries and 20 -> 140 hits; engine 1 appears during the run with 200 / 40
    over two model names: the run's rate is (120 + 40) / (200 + 200) = 40%."""
    exporter = Exporter()
    exporter.observe("0", 100, 20)
    before = prefix_cache_counts(exporter.text())
    exporter.observe("0", 200, 120)
    exporter.observe("1", 150, 40)
    exporter.observe("1", 50, 0, model="other")
    after = prefix_cache_counts(exporter.text())
    assert before == {"0": PrefixCacheCounts(100, 20)}  # neither the _created samples nor prompt tokens
    report = PrefixCacheReport(before, after, cached_tokens=160)
    assert report.engines == {"0": PrefixCacheCounts(200, 120), "1": PrefixCacheCounts(200, 40)}
    assert report.total == PrefixCacheCounts(400, 160) and report.hit_rate_cell() == "40.0%"
    assert report.format().splitlines() == [
        "Prefix cache hit rate (/metrics):        40.0% (160 of 400 prompt tokens)",
        "Cached prompt tokens (usage):            160",
    ]
    assert report.to_json() == {
        "queries": 400,
        "hits": 160,
        "hit_rate": 0.4,
        "cached_tokens": 160,
        "engines": {"0": {"queries": 200, "hits": 120}, "1": {"queries": 200, "hits": 40}},
    }


def test_without_the_counters_it_says_not_available() -> None:
    """A server exporting neither counter nor cached_tokens: n/a on both lines and null in the JSON; with
    counters that did not move, the rate is n/a (no queries) and the counts zero."""
    exporter = Exporter()
    exporter.prompts.labels("m", "0").inc(64)
    nothing = prefix_cache_counts(exporter.text())
    assert nothing == {}
    report = PrefixCacheReport(nothing, nothing, cached_tokens=None)
    assert report.total is None and report.hit_rate_cell() == "n/a"
    assert report.format().splitlines() == [
        "Prefix cache hit rate (/metrics):        n/a (no vllm:prefix_cache_* counters on /metrics)",
        "Cached prompt tokens (usage):            n/a",
    ]
    assert report.to_json() == {
        "queries": None,
        "hits": None,
        "hit_rate": None,
        "cached_tokens": None,
        "engines": {},
    }
    unread = PrefixCacheReport(None, None, 12)  # /metrics could not be read; the usage still counts
    assert unread.format().splitlines() == [
        "Prefix cache hit rate (/metrics):        n/a (/metrics not read)",
        "Cached prompt tokens (usage):            12",
    ]
    exporter.observe("0", 0, 0)
    idle = prefix_cache_counts(exporter.text())
    assert PrefixCacheReport(idle, idle, 0).to_json() == {
        "queries": 0,
        "hits": 0,
        "hit_rate": None,
        "cached_tokens": 0,
        "engines": {"0": {"queries": 0, "hits": 0}},
    }


def test_a_counter_that_went_down_was_reset() -> None:
    """A server restarted during the run (its counters below the first scrape's) counts from zero, as
    Prometheus' increase() does."""
    assert PrefixCacheCounts(30, 10).minus(PrefixCacheCounts(500, 100)) == PrefixCacheCounts(30, 10)
    assert PrefixCacheCounts(530, 110).minus(PrefixCacheCounts(500, 100)) == PrefixCacheCounts(30, 10)


def test_settled_scrape_waits_for_the_prefix_cache_counters(monkeypatch: pytest.MonkeyPatch) -> None:
    """No drafter (no spec-decode series): scrapes still repeat until the prefix-cache counters agree."""
    exporter = Exporter()
    texts = []
    for queries, hits in ((16, 0), (48, 16), (0, 0)):
        exporter.observe("0", queries, hits)
        texts.append(exporter.text())
    monkeypatch.setattr(acceptance, "SETTLE_INTERVAL_S", 0.01)
    monkeypatch.setattr(acceptance, "scrape_metrics", lambda url: texts.pop(0))
    settled = scrape_settled("http://unused/metrics")
    assert settled.settled and not texts and settled.engines == {}
    assert settled.prefix_cache == {"0": PrefixCacheCounts(64, 16)}
