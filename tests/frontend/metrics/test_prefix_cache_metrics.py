"""The prefix-cache bridge: per-engine baselines over cumulative lookups -> exact /metrics, and --state-dir."""

from __future__ import annotations

from pathlib import Path

from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from openinfer.frontend.metrics.state_dir import STATE_FILE, StateDir
from openinfer.protocol import LoadSnapshot, PrefixCacheCounters, SpecDecodeCounters
from tests.frontend.engine_peer import PeerConfig
from tests.frontend.frontends import Frontend, PeerFactory
from tests.frontend.metrics.scrape import sample, scrape, sync
from tests.frontend.waits import wait_until

QUERIES, HITS = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"


def load(prefix_cache: PrefixCacheCounters | None, spec: SpecDecodeCounters | None = None) -> LoadSnapshot:
    return LoadSnapshot(0, 10, 0, 0, spec, prefix_cache)


def lookups(metrics: FrontendMetrics, engine: str, model_name: str = "m") -> tuple[float, float] | None:
    """(queries, hits) of one engine's series; None when the series do not exist."""
    labels = {"model_name": model_name, "engine": engine}
    queries = metrics.registry.get_sample_value(QUERIES, labels)
    hits = metrics.registry.get_sample_value(HITS, labels)
    assert (queries is None) == (hits is None)  # the two series always exist together
    return None if queries is None or hits is None else (queries, hits)


async def test_bridge_publishes_exact_deltas_per_engine(frontend: Frontend, start_peer: PeerFactory) -> None:
    """First sight, lookups, idle, restart and a decrease over real sockets: exact /metrics values."""
    # A never-seen engine whose hello already holds 100 looked-up tokens: an earlier frontend's to count.
    peer = await start_peer(frontend, PeerConfig(prefix_cache=PrefixCacheCounters(100, 40)))
    text = await scrape(frontend)
    assert sample(text, QUERIES, model_name="tiny", engine="0") == 0.0  # series at 0 from the first snapshot
    assert sample(text, HITS, model_name="tiny", engine="0") == 0.0

    # A 64-token prompt of which 3 blocks of 16 were cached, then a cold 16-token one.
    assert peer.prefix_cache is not None
    peer.prefix_cache.record(64, 48)
    peer.prefix_cache.record(16, 0)
    await sync(frontend, peer)
    text = await scrape(frontend)
    assert sample(text, QUERIES, model_name="tiny", engine="0") == 80.0
    assert sample(text, HITS, model_name="tiny", engine="0") == 48.0

    # Idle: the same counters again publish nothing.
    await sync(frontend, peer)
    await sync(frontend, peer)
    text = await scrape(frontend)
    assert sample(text, QUERIES, model_name="tiny", engine="0") == 80.0
    assert sample(text, HITS, model_name="tiny", engine="0") == 48.0

    # A restart whose hello already holds 32 queries and 16 hits: all of it is new.
    peer.prefix_cache = PrefixCacheCounters(32, 16)
    await peer.restart()
    await wait_until(lambda: frontend.client.registry.current(0, peer.incarnation) is not None)
    await sync(frontend, peer)
    text = await scrape(frontend)
    assert sample(text, QUERIES, model_name="tiny", engine="0") == 112.0  # 80 + 32
    assert sample(text, HITS, model_name="tiny", engine="0") == 64.0  # 48 + 16

    # Counters that go down within one incarnation: a protocol error, nothing published, new baseline.
    peer.prefix_cache = PrefixCacheCounters(8, 0)
    await sync(frontend, peer)
    text = await scrape(frontend)
    assert sample(text, "openinfer:protocol_errors_total", kind="counter_decrease") == 1.0
    assert sample(text, QUERIES, model_name="tiny", engine="0") == 112.0
    peer.prefix_cache.record(20, 4)  # counted from the new baseline (8, 0)
    await sync(frontend, peer)
    text = await scrape(frontend)
    assert sample(text, QUERIES, model_name="tiny", engine="0") == 132.0
    assert sample(text, HITS, model_name="tiny", engine="0") == 68.0

    # A second engine has series of its own; no series lacks an engine label, none sums engines.
    other = await start_peer(frontend, PeerConfig(engine_index=1, prefix_cache=PrefixCacheCounters()))
    assert other.prefix_cache is not None
    other.prefix_cache.record(50, 25)
    await sync(frontend, other)
    text = await scrape(frontend)
    assert sample(text, QUERIES, model_name="tiny", engine="1") == 50.0
    assert sample(text, HITS, model_name="tiny", engine="1") == 25.0
    series = [line for line in text.splitlines() if line.startswith("vllm:prefix_cache_")]
    assert len(series) == 4  # (queries, hits) x (engine 0, engine 1)
    assert sample(text, "openinfer:protocol_errors_total", kind="counter_decrease") == 1.0


def test_more_hits_than_queries_in_a_delta_is_a_protocol_error() -> None:
    """Two valid snapshots whose delta has more hits than queries: "counter_delta", nothing published,
    and the next delta is taken from the second snapshot."""
    metrics = FrontendMetrics()
    metrics.observe_load(0, 7, "m", load(PrefixCacheCounters(10, 5)))  # first sight: the baseline
    metrics.observe_load(0, 7, "m", load(PrefixCacheCounters(20, 16)))  # +10 queries, +11 hits
    value = metrics.registry.get_sample_value
    assert value("openinfer:protocol_errors_total", {"kind": "counter_delta"}) == 1.0
    assert lookups(metrics, "0") == (0.0, 0.0)
    metrics.observe_load(0, 7, "m", load(PrefixCacheCounters(30, 20)))
    assert lookups(metrics, "0") == (10.0, 4.0)


def test_prefix_caching_off_publishes_nothing_and_forgets_the_baseline() -> None:
    """None makes no series; after None the engine's counters count from zero (nothing before them is
    ours, nothing is lost); spec-decode counters of the same snapshots are diffed on their own."""
    metrics = FrontendMetrics()
    metrics.observe_load(0, 7, "m", load(None))
    metrics.observe_load(0, 7, "m", load(None))
    assert lookups(metrics, "0") is None

    metrics.observe_load(1, 8, "m", load(PrefixCacheCounters(10, 5)))
    metrics.observe_load(1, 8, "m", load(PrefixCacheCounters(14, 6)))
    assert lookups(metrics, "1") == (4.0, 1.0)
    metrics.observe_load(1, 8, "m", load(None))  # the baseline (14, 6) is forgotten
    metrics.observe_load(1, 8, "m", load(PrefixCacheCounters(3, 2)))  # not a decrease: counted whole
    assert lookups(metrics, "1") == (7.0, 3.0)
    value = metrics.registry.get_sample_value
    assert value("openinfer:protocol_errors_total", {"kind": "counter_decrease"}) is None

    spec = SpecDecodeCounters.zero(2)
    metrics.observe_load(2, 9, "m", load(PrefixCacheCounters(5, 0), spec))
    spec.observe_draft(2, 1)
    metrics.observe_load(2, 9, "m", load(PrefixCacheCounters(4, 0), spec))  # a prefix-cache decrease only
    assert value("openinfer:protocol_errors_total", {"kind": "counter_decrease"}) == 1.0
    assert value("vllm:spec_decode_num_drafts_total", {"model_name": "m", "engine": "2"}) == 1.0


def test_restarted_frontend_continues_prefix_cache_series(tmp_path: Path) -> None:
    """With --state-dir: a known incarnation is diffed against its saved baseline (a lookup after the last
    save counted once), a new incarnation counts from zero, an engine never seen takes its snapshot."""
    first_dir = StateDir(tmp_path)
    first = FrontendMetrics(first_dir)
    first.engine_joined(0, 111)
    first.engine_joined(1, 222)
    first.observe_load(0, 111, "m", load(PrefixCacheCounters(100, 40)))  # first seen: the baseline
    first.observe_load(0, 111, "m", load(PrefixCacheCounters(164, 88)))  # +64, +48
    first.observe_load(1, 222, "m", load(PrefixCacheCounters(10, 0)))
    first.observe_load(1, 222, "m", load(PrefixCacheCounters(42, 16)))  # +32, +16
    first.render()  # a scrape: saved first
    first.observe_load(0, 111, "m", load(PrefixCacheCounters(196, 120)))  # +32, +32, never saved
    first_dir.close()  # as a SIGKILL would

    second = FrontendMetrics(StateDir(tmp_path))
    assert lookups(second, "0") == (64.0, 48.0) and lookups(second, "1") == (32.0, 16.0)
    second.engine_joined(0, 111)
    second.engine_joined(1, 333)
    second.engine_joined(2, 444)
    second.observe_load(0, 111, "m", load(PrefixCacheCounters(196, 120)))
    second.observe_load(1, 333, "m", load(PrefixCacheCounters(16, 8)))
    second.observe_load(2, 444, "m", load(PrefixCacheCounters(50, 10)))
    assert lookups(second, "0") == (96.0, 80.0)  # from the saved baseline (164, 88)
    assert lookups(second, "1") == (48.0, 24.0)  # 32 + 16, 16 + 8: everything the new incarnation holds
    assert lookups(second, "2") == (0.0, 0.0)  # its snapshot is the baseline


def test_state_file_of_an_older_frontend_still_loads(tmp_path: Path) -> None:
    """A state file written before prefix-cache metrics existed (no prefix_cache_baselines) loads: its spec
    series continue, and each engine's prefix-cache counters take their first snapshot as baseline."""
    (tmp_path / STATE_FILE).write_text(
        '{"version": 1, "totals": {"counters": {"vllm:spec_decode_num_drafts": [[["m", "0"], 2.0]]}, '
        '"histograms": {}}, "spec_baselines": {"0": [111, [2, 2, 3, 1, [1, 0], [1, 1, 0]]]}, '
        '"incarnations": {"0": 111}}'
    )  # K=2 after drafts (2 tokens, 1 accepted) and (1, 0)
    metrics = FrontendMetrics(StateDir(tmp_path))
    # That release's engines speak an older protocol: engine 0 is back as a new incarnation, from zero.
    spec = SpecDecodeCounters.zero(2)
    spec.observe_draft(2, 2)
    metrics.observe_load(0, 222, "m", load(PrefixCacheCounters(50, 20), spec))
    value = metrics.registry.get_sample_value
    assert value("vllm:spec_decode_num_drafts_total", {"model_name": "m", "engine": "0"}) == 3.0
    assert lookups(metrics, "0") == (0.0, 0.0)
    metrics.observe_load(0, 222, "m", load(PrefixCacheCounters(66, 36), spec))
    assert lookups(metrics, "0") == (16.0, 16.0)
    metrics.save()
    assert b'"prefix_cache_baselines":{"0":[222,[66,36]]}' in (tmp_path / STATE_FILE).read_bytes()
