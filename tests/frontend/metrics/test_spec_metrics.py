"""The spec-decode bridge end to end (peer -> ZMQ -> EngineClient -> /metrics), and the periodic log line."""

from __future__ import annotations

import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families

from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from openinfer.protocol import LoadSnapshot, SpecDecodeCounters
from openinfer.tools.spec_tally import AcceptanceTally, tally_metrics
from tests.frontend.engine_peer import PeerConfig
from tests.frontend.frontends import Frontend, PeerFactory
from tests.frontend.metrics.scrape import sample, scrape, sync
from tests.frontend.waits import wait_until


def counters(k: int, *drafts: tuple[int, int]) -> SpecDecodeCounters:
    """Counters of K=k after these (num_draft_tokens, num_accepted) drafts."""
    c = SpecDecodeCounters.zero(k)
    for num_draft_tokens, num_accepted in drafts:
        c.observe_draft(num_draft_tokens, num_accepted)
    return c


def spec_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every spec-decode counter sample of an exposition, by (name, labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "spec_decode" in s.name and s.name.endswith("_total")
    }


async def test_bridge_publishes_exact_deltas_per_engine(frontend: Frontend, start_peer: PeerFactory) -> None:
    """Baselines, idle, unverified rounds alone, coalescing, trimmed drafts, unload/reload, new K, restart and
    a decrease: exact /metrics values, the verified and reached per-position counts, the unverified count and
    the confidence sums included."""
    # A never-seen engine: its hello already holds 2 drafts, which an earlier frontend exported.
    peer = await start_peer(frontend, PeerConfig(spec=counters(3, (3, 2), (3, 0))))
    text = await scrape(frontend)
    assert tally_metrics(text) == {
        0: AcceptanceTally(0, 0, 0, [0, 0, 0], [0, 0, 0, 0], 3, [0, 0, 0], 0, [0, 0, 0], [0, 0, 0])
    }  # at 0
    assert sample(text, "vllm:spec_decode_num_drafts_total", model_name="tiny", engine="0") == 0.0

    # Two drafts: 3 of 3 accepted (rated .9, .8, .7 by a confidence head), 1 of 2 (no ratings). Reached:
    # [1, 1, 1] + [1, 1, 0] (token 1 rejected).
    assert peer.spec is not None
    peer.spec.observe_draft(3, 3, confidence=[0.9, 0.8, 0.7])
    peer.spec.observe_draft(2, 1)
    await sync(frontend, peer)
    expected = AcceptanceTally(
        2, 5, 4, [2, 1, 1], [0, 1, 0, 1], 3, [2, 2, 1], 0, [2, 2, 1], [900_000, 800_000, 700_000]
    )  # verified: 3 + 2 tokens
    assert tally_metrics(await scrape(frontend))[0] == expected

    # Idle: the same counters again and again publish nothing.
    await sync(frontend, peer)
    await sync(frontend, peer)
    assert tally_metrics(await scrape(frontend))[0] == expected

    # A round the scheduler verified none of (V = 0, P = 2): no draft, but its 2 unverified tokens are
    # published (the baseline moves on: dropping the interval would lose them).
    peer.spec.observe_unverified(2)
    await sync(frontend, peer)
    assert tally_metrics(await scrape(frontend))[0] == AcceptanceTally(
        2, 5, 4, [2, 1, 1], [0, 1, 0, 1], 3, [2, 2, 1], 2, [2, 2, 1], [900_000, 800_000, 700_000]
    )

    # Resume with three drafts between two snapshots: (3,1) + (3,2) + (1,0) add [2, 1, 0] accepted and
    # [3, 2, 2] verified per position; the last one was trimmed from 3 proposed: 2 more unverified. Reached
    # [1, 1, 0] + [1, 1, 1] + [1, 0, 0]; the (3,2) draft rated .5, .25, .125.
    peer.spec.observe_draft(3, 1)
    peer.spec.observe_draft(3, 2, confidence=[0.5, 0.25, 0.125])
    peer.spec.observe_draft(1, 0, num_unverified=2)
    await sync(frontend, peer)
    micros = [1_400_000, 1_050_000, 825_000]
    assert tally_metrics(await scrape(frontend))[0] == AcceptanceTally(
        5, 12, 7, [4, 2, 1], [1, 2, 1, 1], 3, [5, 4, 3], 4, [5, 4, 2], micros
    )

    # Drafter unloaded, then loaded with K=5: its counters count from zero; positions 3 and 4 appear.
    peer.spec = None
    await sync(frontend, peer)
    peer.spec = counters(5, (5, 5), (4, 2))
    await sync(frontend, peer)
    text = await scrape(frontend)
    assert tally_metrics(text)[0] == AcceptanceTally(
        7,
        21,
        14,
        [6, 4, 2, 1, 1],
        [1, 2, 2, 1, 0, 1],
        5,
        [7, 6, 5, 2, 1],
        4,
        [7, 6, 4, 1, 1],
        [*micros, 0, 0],
    )
    assert sample(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                  model_name="tiny", engine="0", position="4") == 1.0  # fmt: skip
    per_pos_verified = "openinfer:spec_decode_num_draft_tokens_per_pos_total"
    # Both K=5 drafts verified 4+ tokens.
    assert sample(text, per_pos_verified, model_name="tiny", engine="0", position="3") == 2.0
    assert sample(text, "openinfer:spec_decode_num_unverified_draft_tokens_total",
                  model_name="tiny", engine="0") == 4.0  # fmt: skip
    assert sample(text, "openinfer:spec_decode_num_reached_per_pos_total",
                  model_name="tiny", engine="0", position="2") == 4.0  # fmt: skip
    assert sample(text, "openinfer:spec_decode_confidence_micros_per_pos_total",
                  model_name="tiny", engine="0", position="2") == 825_000.0  # fmt: skip
    resets = "openinfer:spec_decode_counter_resets_total"
    assert sample(text, resets, engine="0", reason="drafter_loaded") == 1.0

    # Straight to K=2 (a new K): zero again; the K=5 series stay as they are.
    peer.spec = counters(2, (2, 2), (2, 0))
    await sync(frontend, peer)
    text = await scrape(frontend)
    assert tally_metrics(text)[0] == AcceptanceTally(
        9,
        25,
        16,
        [7, 5, 2, 1, 1],
        [2, 2, 3, 1, 0, 1],
        5,
        [9, 8, 5, 2, 1],
        4,
        [9, 7, 4, 1, 1],
        [*micros, 0, 0],
    )
    assert sample(text, resets, engine="0", reason="new_k") == 1.0

    # A restart whose first hello already holds one draft (rated .6, .3): all of it is new; nothing goes
    # down.
    before = spec_samples(text)
    peer.spec = counters(2)
    peer.spec.observe_draft(2, 1, confidence=[0.6, 0.3])
    micros = [2_000_000, 1_350_000, 825_000, 0, 0]
    await peer.restart()
    await wait_until(lambda: frontend.client.registry.current(0, peer.incarnation) is not None)
    await sync(frontend, peer)
    text = await scrape(frontend)
    assert tally_metrics(text)[0] == AcceptanceTally(
        10, 27, 17, [8, 5, 2, 1, 1], [2, 3, 3, 1, 0, 1], 5, [10, 9, 5, 2, 1], 4, [10, 8, 4, 1, 1], micros
    )
    after = spec_samples(text)
    assert all(after[key] >= value for key, value in before.items())
    assert sample(text, "openinfer:engine_restarts_total", engine="0") == 1.0
    assert sample(text, resets, engine="0", reason="restart") == 1.0

    # Counters that go down within one incarnation: a protocol error, nothing published, new baseline.
    peer.spec = counters(2)
    await sync(frontend, peer)
    text = await scrape(frontend)
    assert sample(text, "openinfer:protocol_errors_total", kind="counter_decrease") == 1.0
    assert tally_metrics(text)[0] == AcceptanceTally(
        10, 27, 17, [8, 5, 2, 1, 1], [2, 3, 3, 1, 0, 1], 5, [10, 9, 5, 2, 1], 4, [10, 8, 4, 1, 1], micros
    )
    peer.spec.observe_draft(2, 2)
    await sync(frontend, peer)
    text = await scrape(frontend)
    assert tally_metrics(text)[0] == AcceptanceTally(
        11, 29, 19, [9, 6, 2, 1, 1], [2, 3, 4, 1, 0, 1], 5, [11, 10, 5, 2, 1], 4, [11, 9, 4, 1, 1], micros
    )

    # A second engine has series of its own; no series lacks an engine label.
    other = await start_peer(frontend, PeerConfig(engine_index=1, spec=counters(4)))
    assert other.spec is not None
    other.spec.observe_draft(4, 4)
    await sync(frontend, other)
    text = await scrape(frontend)
    assert tally_metrics(text)[1] == AcceptanceTally(
        1, 4, 4, [1, 1, 1, 1], [0, 0, 0, 0, 1], 4, [1, 1, 1, 1], 0, [1, 1, 1, 1], [0, 0, 0, 0]
    )
    assert tally_metrics(text)[0].num_drafts == 11
    assert all(dict(labels).get("engine") in ("0", "1") for _, labels in spec_samples(text))
    assert sample(text, "openinfer:protocol_errors_total", kind="counter_decrease") == 1.0


def test_spec_decoding_log_line_sums_engines(caplog: pytest.LogCaptureFixture) -> None:
    """One interval's deltas of a K=3 and a K=1 engine give vLLM's line; per-position rates use each K."""
    metrics = FrontendMetrics()

    def observe(engine: int, spec: SpecDecodeCounters) -> None:
        metrics.observe_load(engine, 7, "tiny", LoadSnapshot(0, 8, 0, 0, spec))

    observe(0, counters(3))
    observe(1, counters(1))
    metrics.spec_decode_log.log(now=100.0)  # starts the interval; nothing drafted yet, so no line
    observe(0, counters(3, (3, 0), (3, 1), (3, 1), (1, 1)))
    observe(0, counters(3, (3, 0), (3, 1), (3, 1), (1, 1), (3, 3)))  # a second snapshot in the interval
    observe(1, counters(1, (1, 1), (1, 0)))
    with caplog.at_level(logging.INFO, logger="openinfer.frontend.spec_decode_log"):
        metrics.spec_decode_log.log(now=104.0)
        metrics.spec_decode_log.log(now=108.0)  # an interval without drafts logs nothing
    # 7 drafts, 15 draft tokens, 7 accepted over 4 s. Position 0: (4 + 1) / (5 + 2) drafts; 1 and 2: 1 / 5.
    # The (1, 1) draft verified 1 token at K=3: positions 1 and 2 were verified by 4 drafts, not 5, so the
    # line goes on with the conditional rates 5/7, 1/4, 1/4.
    assert [r.getMessage() for r in caplog.records] == [
        "SpecDecoding metrics: Mean acceptance length: 2.00, Accepted throughput: 1.75 tokens/s, "
        "Drafted throughput: 3.75 tokens/s, Accepted: 7 tokens, Drafted: 15 tokens, "
        "Per-position acceptance rate: 0.714, 0.200, 0.200, Avg Draft acceptance rate: 46.7%, "
        "Per-position conditional acceptance rate: 0.714, 0.250, 0.250, Unverified: 0 tokens"
    ]


def test_spec_decoding_log_line_with_trimmed_drafts(caplog: pytest.LogCaptureFixture) -> None:
    """Drafts all verified whole at one K give vLLM's line alone; trimmed drafts add the conditional rates
    and the unverified tokens; an interval of rounds verifying nothing logs only those."""
    metrics = FrontendMetrics()
    spec = counters(3)
    metrics.observe_load(0, 7, "tiny", LoadSnapshot(0, 8, 0, 0, spec.copy()))
    metrics.spec_decode_log.log(now=100.0)
    spec.observe_draft(3, 2)
    metrics.observe_load(0, 7, "tiny", LoadSnapshot(0, 8, 0, 0, spec.copy()))
    with caplog.at_level(logging.INFO, logger="openinfer.frontend.spec_decode_log"):
        metrics.spec_decode_log.log(now=102.0)
        spec.observe_draft(2, 2, num_unverified=1)  # P=3, V=2: both verified accepted
        spec.observe_draft(1, 0, num_unverified=2)  # P=3, V=1
        spec.observe_draft(3, 3)
        metrics.observe_load(0, 7, "tiny", LoadSnapshot(0, 8, 0, 0, spec.copy()))
        metrics.spec_decode_log.log(now=104.0)
        spec.observe_unverified(3)
        metrics.observe_load(0, 7, "tiny", LoadSnapshot(0, 8, 0, 0, spec.copy()))
        metrics.spec_decode_log.log(now=106.0)
    # Second interval: accepted per position [2, 2, 1] of 3 drafts, verified [3, 2, 1].
    assert [r.getMessage() for r in caplog.records] == [
        "SpecDecoding metrics: Mean acceptance length: 3.00, Accepted throughput: 1.00 tokens/s, "
        "Drafted throughput: 1.50 tokens/s, Accepted: 2 tokens, Drafted: 3 tokens, "
        "Per-position acceptance rate: 1.000, 1.000, 0.000, Avg Draft acceptance rate: 66.7%",
        "SpecDecoding metrics: Mean acceptance length: 2.67, Accepted throughput: 2.50 tokens/s, "
        "Drafted throughput: 3.00 tokens/s, Accepted: 5 tokens, Drafted: 6 tokens, "
        "Per-position acceptance rate: 0.667, 0.667, 0.333, Avg Draft acceptance rate: 83.3%, "
        "Per-position conditional acceptance rate: 0.667, 1.000, 1.000, Unverified: 3 tokens",
        "SpecDecoding metrics: no draft verified, Unverified: 3 tokens",
    ]


def test_spec_decoding_log_line_with_confidences(caplog: pytest.LogCaptureFixture) -> None:
    """Drafts a confidence head rated add its calibration to the line: per position, the mean confidence
    and the acceptance of the drafts that reached it (verified, every token before it accepted)."""
    metrics = FrontendMetrics()
    spec = counters(3)
    metrics.observe_load(0, 7, "tiny", LoadSnapshot(0, 8, 0, 0, spec.copy()))
    metrics.spec_decode_log.log(now=100.0)
    spec.observe_draft(3, 3, confidence=[0.9, 0.8, 0.7])
    spec.observe_draft(3, 1, confidence=[0.7, 0.4, 0.1])  # reaches 0 and 1; the .1 is never counted
    metrics.observe_load(0, 7, "tiny", LoadSnapshot(0, 8, 0, 0, spec.copy()))
    with caplog.at_level(logging.INFO, logger="openinfer.frontend.spec_decode_log"):
        metrics.spec_decode_log.log(now=102.0)
    # reached [2, 2, 1], accepted [2, 1, 1]: mean confidence 1.6/2, 1.2/2, .7/1; reached acceptance 1, .5, 1
    assert [r.getMessage() for r in caplog.records] == [
        "SpecDecoding metrics: Mean acceptance length: 3.00, Accepted throughput: 2.00 tokens/s, "
        "Drafted throughput: 3.00 tokens/s, Accepted: 4 tokens, Drafted: 6 tokens, "
        "Per-position acceptance rate: 1.000, 0.500, 0.500, Avg Draft acceptance rate: 66.7%, "
        "Per-position mean confidence: 0.800, 0.600, 0.700, "
        "Per-position reached acceptance rate: 1.000, 0.500, 1.000"
    ]


def test_impossible_delta_is_a_protocol_error() -> None:
    """Draft tokens that grow while drafts do not (both snapshots valid): "counter_delta", nothing out."""
    metrics = FrontendMetrics()
    one_token = SpecDecodeCounters(
        2, 1, 1, 0, [0, 0], [1, 0, 0], [1, 0], 0, [1, 0], [0, 0]
    )  # 1 draft of 1 token, none accepted
    two_tokens = SpecDecodeCounters(
        2, 1, 2, 0, [0, 0], [1, 0, 0], [1, 1], 0, [1, 0], [0, 0]
    )  # the same draft, now 2 tokens
    metrics.observe_load(0, 7, "tiny", LoadSnapshot(0, 8, 0, 0, SpecDecodeCounters.zero(2)))
    metrics.observe_load(0, 7, "tiny", LoadSnapshot(0, 8, 0, 0, one_token))
    metrics.observe_load(0, 7, "tiny", LoadSnapshot(0, 8, 0, 0, two_tokens))
    value = metrics.registry.get_sample_value
    assert value("openinfer:protocol_errors_total", {"kind": "counter_delta"}) == 1.0
    labels = {"model_name": "tiny", "engine": "0"}
    assert value("vllm:spec_decode_num_draft_tokens_total", labels) == 1.0  # only the first draft
